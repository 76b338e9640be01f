"""Hugging Face's TGI Python client (text-generation) against a running gateway's MindIE routes
(started by scripts/sdk-test, after the OpenAI SDK test).

Checks that an unmodified TGI client streams through /infer, and that the gateway's
refusals, in the {"error", "error_type"} shape MindIE answers on these routes, surface as the
client's typed exceptions with the gateway's message.
"""
import os
import unittest
import warnings

# The client (written for pydantic 1) calls a method pydantic 2 deprecates: not this test's news.
warnings.filterwarnings("ignore", category=DeprecationWarning, module="text_generation")

from text_generation import Client  # noqa: E402
from text_generation.errors import BadRequestError, RateLimitExceededError  # noqa: E402

BASE = os.environ["TOKENGATE_URL"]


def client(key="sk-alice"):
    # This client posts to the URL it is given, with `stream` in the body: MindIE's /infer.
    # (Its non-streamed `generate` expects TGI's `/`, which answers a list; MindIE has none.)
    return Client(BASE + "/infer", headers={"Authorization": f"Bearer {key}"}, timeout=60)


class TgiClient(unittest.TestCase):
    def test_generate_stream(self):
        tokens = list(client().generate_stream("Hello!", max_new_tokens=6))
        self.assertTrue(1 <= len(tokens) <= 6, len(tokens))
        last = tokens[-1]
        self.assertEqual(last.details.generated_tokens, len(tokens))
        self.assertEqual(last.generated_text, "".join(t.token.text for t in tokens))

    def test_bad_request_is_bad_request_error(self):
        with self.assertRaises(BadRequestError) as cm:
            list(client().generate_stream("hi", max_new_tokens=0))
        self.assertEqual(str(cm.exception), "`parameters.max_new_tokens` must be at least 1, got 0")

    def test_drained_bucket_is_rate_limit_error(self):
        # alice's decode bucket holds 300 tokens (20/s x 15 s): once an answer has used some,
        # 299 more do not fit until it refills.
        c = client()
        tokens = list(c.generate_stream("hi", max_new_tokens=250))
        self.assertGreater(len(tokens), 1)
        with self.assertRaises(RateLimitExceededError) as cm:
            list(c.generate_stream("hi", max_new_tokens=299))
        self.assertIn("rate limit reached for decode: request needs 299 tokens", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
