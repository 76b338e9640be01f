"""The official Anthropic Python SDK against a running gateway (started by scripts/sdk-test).

Checks that an unmodified client of the Messages API works through the gateway: non-streamed and
streamed messages, count_tokens, the key sent as `x-api-key`, and the gateway's errors surfacing
as the SDK's typed exceptions with Anthropic's error types and rate-limit headers. The tenant is
`claude`, which scripts/sdk-test adds for these tests (20 decode tokens a second, 15 s of burst).
"""
import os
import unittest

import anthropic

BASE = os.environ["TOKENGATE_URL"]
MODEL = "qwen3.5-27b"
HELLO = [{"role": "user", "content": "Hello!"}]


def client(key="sk-claude"):
    return anthropic.Anthropic(base_url=BASE, api_key=key, max_retries=0)


class AnthropicSdk(unittest.TestCase):
    def test_message_non_streamed(self):
        r = client().messages.create(model=MODEL, max_tokens=8, messages=HELLO,
                                     system="Be brief.", extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.output_tokens, 8)
        self.assertEqual(r.stop_reason, "max_tokens")
        self.assertEqual(r.content[0].type, "text")
        # The gateway counts the prompt as the backend does: count_tokens agrees with the usage.
        counted = client().messages.count_tokens(model=MODEL, messages=HELLO, system="Be brief.")
        self.assertEqual(counted.input_tokens, r.usage.input_tokens)

    def test_message_streamed(self):
        with client().messages.stream(model=MODEL, max_tokens=6, messages=HELLO,
                                      extra_body={"ignore_eos": True}) as s:
            pieces = list(s.text_stream)
            final = s.get_final_message()
        self.assertEqual(len(pieces), 6)
        self.assertEqual(final.usage.output_tokens, 6)

    def test_bad_key_is_authentication_error(self):
        with self.assertRaises(anthropic.AuthenticationError) as cm:
            client("sk-wrong").messages.create(model=MODEL, max_tokens=1, messages=HELLO)
        self.assertEqual(cm.exception.body["error"]["type"], "authentication_error")

    def test_bad_request_is_bad_request_error(self):
        with self.assertRaises(anthropic.BadRequestError) as cm:
            client().messages.create(model=MODEL, max_tokens=0, messages=HELLO)
        self.assertEqual(cm.exception.body["error"]["type"], "invalid_request_error")
        self.assertIn("max_tokens", cm.exception.body["error"]["message"])

    def test_drained_bucket_is_rate_limit_error(self):
        # claude's decode bucket holds 300 tokens: two 250-token reservations cannot both fit
        # (the first may already find it drained by the other tests).
        c = client()
        with self.assertRaises(anthropic.RateLimitError) as cm:
            for _ in range(2):
                c.messages.create(model=MODEL, max_tokens=250, messages=HELLO,
                                  extra_body={"ignore_eos": True})
        self.assertEqual(cm.exception.body["error"]["type"], "rate_limit_error")
        headers = cm.exception.response.headers
        self.assertIsNotNone(headers.get("retry-after"))
        self.assertEqual(headers.get("anthropic-ratelimit-output-tokens-limit"), "300")


if __name__ == "__main__":
    unittest.main(verbosity=2)
