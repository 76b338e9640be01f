"""The official OpenAI Python SDK against a running gateway (started by scripts/sdk-test).

Checks that an unmodified client works: non-streamed and streamed chats, two choices,
completions, the Responses API streamed and not, and that the gateway's errors surface as the
SDK's typed exceptions.
"""
import os
import unittest

import openai
from openai import OpenAI

BASE = os.environ["TOKENGATE_URL"]
MODEL = "qwen3.5-27b"


def client(key="sk-alice"):
    return OpenAI(base_url=BASE + "/v1", api_key=key, max_retries=0)


class OpenAISdk(unittest.TestCase):
    def test_chat_non_streamed(self):
        r = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8,
            extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 8)
        self.assertTrue(r.choices[0].message.content)

    def test_chat_streamed(self):
        stream = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=6,
            stream=True, extra_body={"ignore_eos": True})
        pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
        self.assertEqual(len(pieces), 6)

    def test_chat_streamed_with_usage(self):
        stream = client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=4,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks = list(stream)
        self.assertEqual(chunks[-1].usage.completion_tokens, 4)

    def test_completions(self):
        r = client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5,
                                        extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 5)

    def test_chat_of_two_choices(self):
        r = client("sk-codex").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=4, n=2,
            extra_body={"ignore_eos": True})
        self.assertEqual([c.index for c in r.choices], [0, 1])
        self.assertEqual(r.usage.completion_tokens, 8)

    def test_responses_non_streamed(self):
        r = client("sk-codex").responses.create(
            model=MODEL, input="Hello!", instructions="Be brief.", max_output_tokens=8,
            extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.output_tokens, 8)
        self.assertTrue(r.output_text)

    def test_responses_streamed(self):
        events = list(client("sk-codex").responses.create(
            model=MODEL, input=[{"role": "user", "content": "Hello!"}], max_output_tokens=6,
            stream=True, extra_body={"ignore_eos": True}))
        deltas = [e for e in events if e.type == "response.output_text.delta"]
        self.assertEqual(len(deltas), 6)
        self.assertEqual(events[-1].type, "response.completed")
        self.assertEqual(events[-1].response.usage.output_tokens, 6)

    def test_responses_previous_response_id_is_bad_request_error(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client("sk-codex").responses.create(model=MODEL, input="Hi",
                                                previous_response_id="resp_1")
        self.assertEqual(cm.exception.param, "previous_response_id")

    def test_bad_key_is_authentication_error(self):
        with self.assertRaises(openai.AuthenticationError) as cm:
            client("sk-wrong").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        self.assertEqual(cm.exception.code, "invalid_api_key")

    def test_bad_request_is_bad_request_error(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0)
        self.assertEqual(cm.exception.param, "max_tokens")

    def test_unknown_model_is_not_found_error(self):
        with self.assertRaises(openai.NotFoundError):
            client().chat.completions.create(
                model="gpt-nothing", messages=[{"role": "user", "content": "hi"}], max_tokens=1)

    def test_drained_bucket_is_rate_limit_error(self):
        # bob's decode bucket holds 300 tokens (20/s x 15 s); two 250-token reservations
        # cannot both fit.
        c = client("sk-bob")
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                  max_tokens=250, extra_body={"ignore_eos": True})
        with self.assertRaises(openai.RateLimitError) as cm:
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=250)
        self.assertEqual(cm.exception.code, "rate_limit_exceeded")
        self.assertIsNotNone(cm.exception.response.headers.get("retry-after"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
