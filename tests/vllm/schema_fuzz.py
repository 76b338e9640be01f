"""The schema fuzzer: requests written from vLLM's own request models, sent through the gateway
and straight to the same vLLM, and the two outcomes compared.

parity.py sends the shapes the project thought of. This file makes its requests from what the
engine itself declares: at run time it imports vLLM's pydantic request models from the venv it
runs in (`ChatCompletionRequest`, `CompletionRequest`, `ResponsesRequest`,
`AnthropicMessagesRequest`, `AnthropicCountTokensRequest`, `TokenizeCompletionRequest`,
`TokenizeChatRequest`, `DetokenizeRequest`, and, drawn apart (`--later-cases`),
`BatchChatCompletionRequest` for `/v1/chat/completions/batch` and `GenerativeScoringRequest`
for `/generative_scoring`; with `--pooling`, the pooling runner's:
`EmbeddingCompletionRequest`, `EmbeddingChatRequest`, `EmbeddingBatchChatRequest`,
`EmbeddingChatInputRequest`, `PoolingCompletionRequest`, `PoolingChatRequest`, the four
`ScoreRequest` models and `RerankRequest`, and, drawn apart, `CohereEmbedRequest` for
`/v2/embed`) and walks each field's type (`model_fields`: the annotation, its optionality,
`Literal`s, nested models and typed dicts, `Field` bounds). A case is
a valid body of the route (a chat of parity.py's material) with one to three fields set to a value
drawn for that field's type: a valid one, one of the coercions pydantic's lax mode accepts
(numbers and booleans as strings, whole floats for integers, `1`/`0` for booleans), a boundary
(0, -1, `-0`, 2^63, 2^64, 10^30, the context, one past it, NaN, Infinity, 1e400), `null`, `{}`,
`[]`, or a wrong type; and a tenth of the bodies start with a UTF-8 byte order mark. So a new vLLM
with new fields or new types is fuzzed on its own terms.

Each case goes through a gateway (the binary under test, `backends[].vllm_version` declared) and
straight to vLLM. Compared:

- the status class: served (2xx) or refused (4xx); a vLLM 5xx (the engine failing the body) is
  agreement with either;
- for a body both serve, the gateway's usage-log line against vLLM's `usage` (the prompt the
  gateway counted before forwarding; the output it metered against the usage of its own answer);
  for a body whose output limit is a small number in any spelling, the output vLLM generated for
  the body sent straight to it too (the gateway forwards what vLLM allows: a toy model with random
  weights nearly never ends before its limit);
- `/tokenize`, `/detokenize` and `count_tokens`, which the gateway answers itself: status and
  fields.

With `--pooling` the cases go to `/v1/embeddings`, `/pooling`, `/score` (or `/v1/score`) and
`/rerank` (or `/v1/rerank`, `/v2/rerank`), then `/v2/embed`, of a vLLM serving the model with
its pooling runner (scripts/vllm-serve --pooling), behind a gateway that declares it
`runner = "pooling"` beside a simulated generator; a served body's counted prompt is compared with vLLM's usage (for an
embedding's `bytes` encoding, the usage of its `metadata` header).

A body whose output could be long is braked: `stop` strings ("e", "a", " ", "\\n") end a random
model's answer within a few tokens on both paths (a body that fuzzes `stop` itself is not
braked, and its output limit is kept small).

A difference is either explained by a rule of `KNOWN` (docs/vllm-parity.md, each with its
reason; the difference must then be the one the rule names) or fails the run.

    python tests/vllm/schema_fuzz.py [--pooling] --gateway BINARY --vllm-url URL [--cases N] [--seed S]

Run with the vLLM venv's Python. Prints the time of each part, the cases per route and per
outcome, and ends with `schema fuzz: N cases, M differences (K known)`; exits 1 on an
unexplained difference.
"""

import argparse
import collections
import collections.abc
import concurrent.futures
import dataclasses
import http.client
import json
import math
import random
import sys
import tempfile
import time
import types
import typing
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import parity  # noqa: E402
from parity import KEY, MAX_MODEL_LEN, MODEL, material  # noqa: E402
import harness  # noqa: E402  (on the path parity.py set)

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
TOKENIZE = "/tokenize"
DETOKENIZE = "/detokenize"
BATCH = "/v1/chat/completions/batch"
SCORING = "/generative_scoring"

# The routes and their share of the cases. MindIE's native routes (/infer, /generate,
# /generate_stream, Triton's) have no equivalent in vLLM 0.32's OpenAI server and are not sent;
# the pooling routes need vLLM's pooling runner (--pooling, below).
ROUTES = [(CHAT, 30), (COMPLETIONS, 18), (RESPONSES, 14), (MESSAGES, 14), (COUNT_TOKENS, 6),
          (TOKENIZE, 10), (DETOKENIZE, 4)]

# Routes the gateway took on after the ones above, drawn by a generator of their own after
# them, so that a seed's cases of the routes above stay the ones earlier runs sent.
LATER_ROUTES = [(BATCH, 2), (SCORING, 1)]

# With --pooling, the pooling routes instead, against vLLM's pooling runner (scripts/vllm-serve
# --pooling): each score and rerank case goes to one of the route's paths.
EMBEDDINGS = "/v1/embeddings"
POOLING = "/pooling"
SCORE = "/score"
RERANK = "/rerank"
POOLING_ROUTES = [(EMBEDDINGS, 40), (POOLING, 20), (SCORE, 20), (RERANK, 20)]
# The pooling route the gateway took on after those, drawn apart as `LATER_ROUTES` are.
COHERE = "/v2/embed"
POOLING_LATER_ROUTES = [(COHERE, 1)]
PATHS = {SCORE: ["/score", "/v1/score"], RERANK: ["/rerank", "/v1/rerank", "/v2/rerank"]}
# The routes whose bodies may carry a conversation (OpenAI's messages, or Anthropic's).
CONVERSATIONS = (CHAT, TOKENIZE, MESSAGES, COUNT_TOKENS, RESPONSES, EMBEDDINGS, POOLING, BATCH)
# Of those, the ones whose conversations are OpenAI's (a replayed tool call in `tool_calls`).
OPENAI_CONVERSATIONS = (CHAT, TOKENIZE, EMBEDDINGS, POOLING)

# The fields of each route's body whose output limit is the route's, the one vLLM reads
# first (a chat's `max_completion_tokens` wins over its `max_tokens`: a case with a small
# `max_tokens` and a fuzzed `max_completion_tokens` of 32000 is not small, and is braked).
LIMITS = {CHAT: ("max_completion_tokens", "max_tokens"), COMPLETIONS: ("max_tokens",),
          BATCH: ("max_completion_tokens", "max_tokens"),
          RESPONSES: ("max_output_tokens",), MESSAGES: ("max_tokens",)}

# Fields never fuzzed: the request id the gateway logs by; what only a disaggregated deployment
# reads (vLLM would wait for a remote prefill); and `seed`, which the gateway passes on untouched
# and which kills vLLM 0.32's CPU engine once a seeded request's prefill is split over steps (its
# CPU random generator has no offset to rewind: "CPU Generator does not use offset").
NEVER = {"request_id", "kv_transfer_params", "ec_transfer_params", "seed"}

# Values whose work on the toy engine is unbounded or slow (structured outputs compile a grammar
# per request; a beam search decodes many sequences) are drawn no larger than these.
SMALL = {"n": 3, "best_of": 3, "min_tokens": 200, "top_logprobs": 5, "logprobs": 5,
         "prompt_logprobs": 5, "stream_interval": 4}


# Values never drawn: `padding: "max_length"` runs each prompt of a pooling case padded to the
# whole context on the toy engine (32,768 tokens a text, minutes a case on a CPU); the gateway
# refuses it before anything is charged (docs/vllm-parity.md), and parity.py's named case
# "padded" holds that to the engine.
UNSENT = {("padding", "max_length")}


class Raw(str):
    """A JSON token written as it is (`-0`, `1e400`, an integer past 64 bits kept as typed)."""


def encode(body, bom=False):
    """`body` as the bytes a client sends: Python's json (NaN and Infinity as JavaScript spells
    them, as Python's own parser reads them), `Raw` tokens verbatim."""
    raws = []

    def swap(v):
        if isinstance(v, Raw):
            raws.append(str(v))
            return f"\x00raw{len(raws) - 1}\x00"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    text = json.dumps(swap(body), ensure_ascii=False, allow_nan=True)
    for i, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{i}\x00"), raw)
    data = text.encode()
    return b"\xef\xbb\xbf" + data if bom else data


# ---------------------------------------------------------------------------------------------
# Values from types.


def unwrap(tp):
    """The type under `Required`/`NotRequired`/`ReadOnly`, and `Annotated`'s metadata."""
    meta = []
    while True:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            tp, *more = typing.get_args(tp)
            meta += more
        elif origin is not None and getattr(origin, "_name", None) in ("Required", "NotRequired",
                                                                       "ReadOnly"):
            tp = typing.get_args(tp)[0]
        else:
            return tp, meta


def bounds(meta):
    """`Field(ge=..., le=...)` bounds found in `Annotated` metadata (pydantic keeps them as
    annotated_types objects, or inside a nested FieldInfo)."""
    lo = hi = None
    for m in meta:
        for item in [m] + list(getattr(m, "metadata", []) or []):
            lo = getattr(item, "ge", lo) if getattr(item, "ge", None) is not None else lo
            hi = getattr(item, "le", hi) if getattr(item, "le", None) is not None else hi
    return lo, hi


class Draw:
    """Draws values for types, recording what kind of value each was."""

    def __init__(self, rng):
        self.rng = rng

    def int_(self, name, lo=None, hi=None):
        r = self.rng
        small = SMALL.get(name, 16)
        valid = [0, 1, 2, 3, r.randint(1, small)]
        kind = r.choices(["valid", "coerced", "boundary", "wrong", "null"], [4, 3, 3, 1, 1])[0]
        if kind == "valid":
            v = r.choice(valid)
            if lo is not None and v < lo:
                v = lo
            return kind, v
        if kind == "coerced":
            n = r.randint(1, min(small, 5))
            return kind, r.choice([str(n), f"{n}.0", float(n), f" {n} ", f"+{n}", True])
        if kind == "boundary":
            edges = [-1, Raw("-0"), -2, 2**31, 2**63 - 1, 2**63, 2**64, Raw("1" + "0" * 30),
                     -(2**63), MAX_MODEL_LEN, MAX_MODEL_LEN - 1, MAX_MODEL_LEN + 1, 32000]
            edges += [b for b in (lo, hi) if b is not None]
            if name in SMALL:
                # Past the engine's work bound only where it refuses (negative, past the context).
                edges = [e for e in edges if not isinstance(e, int) or e < 0 or e > MAX_MODEL_LEN]
                edges += [0, 1]
            return kind, r.choice(edges)
        if kind == "wrong":
            return kind, r.choice([2.5, "x", "", [], {}, float("nan"), float("inf"), Raw("1e400")])
        return kind, None

    def float_(self):
        r = self.rng
        kind = r.choices(["valid", "coerced", "boundary", "wrong", "null"], [4, 2, 3, 1, 1])[0]
        if kind == "valid":
            return kind, r.choice([0.0, 0.5, 1, 0.9, 2])
        if kind == "coerced":
            return kind, r.choice(["0.7", "1", " 0.5 ", "nan", "inf", True])
        if kind == "boundary":
            return kind, r.choice([float("nan"), float("inf"), float("-inf"), Raw("-0"), -0.0,
                                   -1, 1e308, Raw("1e400"), 2**64])
        if kind == "wrong":
            return kind, r.choice(["x", "", [], {}])
        return kind, None

    def bool_(self):
        r = self.rng
        kind = r.choices(["valid", "coerced", "wrong", "null"], [4, 4, 2, 1])[0]
        if kind == "valid":
            return kind, r.choice([True, False])
        if kind == "coerced":
            return kind, r.choice(["true", "false", "True", "yes", "no", "on", "off", "1", "0",
                                   1, 0, 1.0, 0.0, "t", "n"])
        if kind == "wrong":
            return kind, r.choice([2, "maybe", "", {}, [], 0.5])
        return kind, None

    def str_(self):
        r = self.rng
        kind = r.choices(["valid", "wrong", "null"], [6, 2, 1])[0]
        if kind == "valid":
            return kind, r.choice(["x", "hello", "", " ", "\u00e9\u4e2d", "NaN", "0"])
        if kind == "wrong":
            return kind, r.choice([5, 2.5, True, [], {}])
        return kind, None

    def value(self, tp, name="", depth=0):
        """(kind, value) for type `tp`; `name` is the field's (for its domain)."""
        r = self.rng
        tp, meta = unwrap(tp)
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if tp is type(None):
            return "null", None
        if origin in (typing.Union, types.UnionType):
            members = [a for a in args if a is not type(None)]
            if len(members) < len(args) and r.random() < 0.15:
                return "null", None
            return self.value(r.choice(members), name, depth)
        if origin is typing.Literal:
            if r.random() < 0.85:
                return "valid", r.choice([a for a in args if (name, a) not in UNSENT])
            return "wrong", r.choice(["bogus", "", None, 1])
        if tp is bool:
            return self.bool_()
        if tp is int:
            lo, hi = bounds(meta)
            return self.int_(name, lo, hi)
        if tp is float:
            return self.float_()
        if tp in (str, bytes):
            return self.str_()
        if tp is typing.Any or tp is object:
            return "valid", r.choice([1, "x", None, True, {"a": 1}, [1, "b"], 2.5])
        if depth > 3:
            return "null", None
        if origin in (list, collections.abc.Iterable, collections.abc.Sequence, set, frozenset,
                      tuple, typing.List):
            item = args[0] if args else typing.Any
            roll = r.random()
            if roll < 0.15:
                return "boundary", []
            if roll < 0.22:
                return "wrong", r.choice(["x", {}, 5])
            items = [self.value(item, name, depth + 1)[1] for _ in range(r.randint(1, 3))]
            return "valid", items
        if origin in (dict, collections.abc.Mapping, typing.Dict):
            val = args[1] if len(args) == 2 else typing.Any
            roll = r.random()
            if roll < 0.3:
                return "boundary", {}
            if roll < 0.38:
                return "wrong", r.choice(["x", [], 5])
            return "valid", {r.choice(["a", "k", "enable_thinking", "min_pixels"]):
                             self.value(val, name, depth + 1)[1]}
        fields = model_fields(tp)
        if fields is not None:
            roll = r.random()
            if roll < 0.1:
                return "boundary", {}
            if roll < 0.15:
                return "wrong", r.choice(["x", [], 5])
            out = {}
            for key, (ftp, required) in fields.items():
                if required or r.random() < 0.35:
                    out[key] = self.value(ftp, key, depth + 1)[1]
            return "valid", out
        return "valid", None


def model_fields(tp):
    """{key: (type, required)} of a pydantic model, typed dict or dataclass; None otherwise."""
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - the vLLM venv has pydantic
        BaseModel = ()
    if isinstance(tp, type) and BaseModel and issubclass(tp, BaseModel):
        return {(f.alias or k): (f.annotation, f.is_required()) for k, f in tp.model_fields.items()}
    if isinstance(tp, type) and hasattr(tp, "__required_keys__"):
        try:
            hints = typing.get_type_hints(tp, include_extras=True)
        except Exception:
            return {}
        return {k: (v, k in tp.__required_keys__) for k, v in hints.items()}
    if dataclasses.is_dataclass(tp):
        return {f.name: (f.type if not isinstance(f.type, str) else typing.Any, False)
                for f in dataclasses.fields(tp)}
    return None


# ---------------------------------------------------------------------------------------------
# The engine's models.


def engine_models():
    """Each route's request model(s), from the vLLM installed beside this Python."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.anthropic.protocol import (AnthropicCountTokensRequest,
                                                     AnthropicMessagesRequest)
    from vllm.entrypoints.serve.tokenize.protocol import (DetokenizeRequest, TokenizeChatRequest,
                                                          TokenizeCompletionRequest)
    return {CHAT: [ChatCompletionRequest], COMPLETIONS: [CompletionRequest],
            RESPONSES: [ResponsesRequest], MESSAGES: [AnthropicMessagesRequest],
            COUNT_TOKENS: [AnthropicCountTokensRequest],
            TOKENIZE: [TokenizeCompletionRequest, TokenizeChatRequest],
            DETOKENIZE: [DetokenizeRequest]}


def later_models(pooling):
    """The request models of `LATER_ROUTES`: the batch of chats', generative scoring's; with
    `pooling`, of `POOLING_LATER_ROUTES`: Cohere's embed."""
    if pooling:
        from vllm.entrypoints.pooling.embed.protocol import CohereEmbedRequest
        return {COHERE: [CohereEmbedRequest]}
    from vllm.entrypoints.generate.generative_scoring.serving import GenerativeScoringRequest
    from vllm.entrypoints.openai.chat_completion.protocol import BatchChatCompletionRequest
    return {BATCH: [BatchChatCompletionRequest], SCORING: [GenerativeScoringRequest]}


def pooling_models():
    """The pooling routes' request models (`EmbeddingRequest`, `PoolingRequest` but the
    IOProcessor plugins' own, `ScoreRequest` and `RerankRequest`'s members)."""
    from vllm.entrypoints.pooling.embed.protocol import (EmbeddingBatchChatRequest,
                                                         EmbeddingChatInputRequest,
                                                         EmbeddingChatRequest,
                                                         EmbeddingCompletionRequest)
    from vllm.entrypoints.pooling.pooling.protocol import (PoolingChatRequest,
                                                           PoolingCompletionRequest)
    from vllm.entrypoints.pooling.scoring.protocol import (RerankRequest, ScoreDataRequest,
                                                           ScoreQueriesDocumentsRequest,
                                                           ScoreQueriesItemsRequest,
                                                           ScoreTextRequest)
    return {EMBEDDINGS: [EmbeddingCompletionRequest, EmbeddingChatRequest,
                         EmbeddingBatchChatRequest, EmbeddingChatInputRequest],
            POOLING: [PoolingCompletionRequest, PoolingChatRequest],
            SCORE: [ScoreQueriesDocumentsRequest, ScoreQueriesItemsRequest, ScoreDataRequest,
                    ScoreTextRequest],
            RERANK: [RerankRequest]}


# ---------------------------------------------------------------------------------------------
# Bodies.


def base_body(route, model, rng):
    """A valid body of `route` for request model `model`, of parity.py's material."""
    messages, tools = parity.random_messages(rng, False)
    if route == CHAT:
        body = {"model": MODEL, "messages": messages, "max_tokens": rng.randint(1, 4)}
        if tools:
            body["tools"] = tools
        if rng.random() < 0.25:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        return body
    if route == BATCH:
        conversations = [messages] + [parity.random_messages(rng, False)[0]
                                      for _ in range(rng.choice([0, 0, 1, 2]))]
        body = {"model": MODEL, "messages": conversations, "max_tokens": rng.randint(1, 4)}
        if tools:
            body["tools"] = tools
        return body
    if route == SCORING:
        n = rng.randint(1, 3)
        if rng.random() < 0.2:
            query = [rng.randrange(248044) for _ in range(rng.randint(1, 8))]
        else:
            query = parity.random_text(rng)
        if rng.random() < 0.2:
            items = [[rng.randrange(248044) for _ in range(rng.randint(1, 8))] for _ in range(n)]
        else:
            items = [parity.random_text(rng) for _ in range(n)]
        labels = [rng.randrange(248044) for _ in range(rng.randint(1, 3))]
        return {"model": MODEL, "query": query, "items": items, "label_token_ids": labels}
    if route == COMPLETIONS:
        prompt = parity.random_text(rng)
        if rng.random() < 0.15:
            prompt = [rng.randrange(248044) for _ in range(rng.randint(1, 12))]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": rng.randint(1, 4)}
        if rng.random() < 0.25:
            body["stream"] = True
        return body
    if route == RESPONSES:
        return parity.as_responses_body(rng, messages, tools)
    if route in (MESSAGES, COUNT_TOKENS):
        body = parity.as_messages_body(rng, messages, tools)
        if route == COUNT_TOKENS:
            body.pop("max_tokens")
            body.pop("stream", None)
        return body
    if route == TOKENIZE:
        if model.__name__ == "TokenizeChatRequest":
            return {"model": MODEL, "messages": messages}
        return {"model": MODEL, "prompt": parity.random_text(rng)}
    if route in (EMBEDDINGS, POOLING):
        return pooling_body(model.__name__, messages, rng)
    if route == COHERE:
        texts = [parity.random_text(rng) for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            inputs = [{"content": [{"type": "text", "text": t}]} for t in texts]
            return {"model": MODEL, "inputs": inputs}
        return {"model": MODEL, "texts": texts}
    if route in (SCORE, RERANK):
        texts = [parity.random_text(rng) for _ in range(rng.randint(1, 3))]
        query = parity.random_text(rng)
        keys = {"ScoreQueriesDocumentsRequest": ("queries", "documents"),
                "ScoreQueriesItemsRequest": ("queries", "items"),
                "ScoreDataRequest": ("data_1", "data_2"), "ScoreTextRequest": ("text_1", "text_2"),
                "RerankRequest": ("query", "documents")}[model.__name__]
        return {"model": MODEL, keys[0]: query, keys[1]: texts if len(texts) > 1 else texts[0]}
    ids = [rng.randrange(248044) for _ in range(rng.randint(0, 20))]
    return {"model": MODEL, "tokens": ids}


def pooling_body(model, messages, rng):
    """A valid body of an embedding or pooling request model named `model`."""
    if model in ("EmbeddingChatRequest", "PoolingChatRequest"):
        return {"model": MODEL, "messages": messages}
    if model == "EmbeddingBatchChatRequest":
        return {"model": MODEL, "messages": [messages, parity.random_messages(rng, False)[0]]}
    if model == "EmbeddingChatInputRequest":
        return {"model": MODEL, "input": messages}
    texts = [parity.random_text(rng) for _ in range(rng.randint(1, 3))]
    roll = rng.random()
    if roll < 0.15:
        prompt = [rng.randrange(248044) for _ in range(rng.randint(1, 12))]
    elif roll < 0.25:
        prompt = [[rng.randrange(248044) for _ in range(rng.randint(1, 8))] for _ in texts]
    else:
        prompt = texts if len(texts) > 1 else texts[0]
    return {"model": MODEL, "input": prompt}


# Tool-call arguments a client replays as the model wrote them: numbers Python's json keeps
# exactly (integers past 64 bits, -0) or reads where strict JSON does not (NaN, Infinity).
ODD_ARGUMENTS = ['{"n": 123456789012345678901234567890}', '{"n": -0}', '{"n": NaN}',
                 '{"n": Infinity, "m": -Infinity}', '{"v": [1, -0, 18446744073709551616]}',
                 '{"x": 1e400}', '{"x": -0.0, "y": 1E5}', '{"deep": {"k": [NaN, 2]}}']

# Content parts vLLM reads as text, skips, or refuses.
PARTS = [{"type": "refusal", "refusal": "I cannot help with that."},
         {"type": "thinking", "thinking": "Let me think."},
         {"type": "text", "text": None}, {"type": "refusal", "refusal": None},
         {"type": "input_text", "text": "Input text."}, {"type": "output_text", "text": "Out."},
         {"type": "text"}, {"text": "untyped"}, {"type": "thinking", "thinking": None},
         {"type": "text", "text": "extra", "cache_control": {"type": "ephemeral"}}]


def message_variant(route, body, rng):
    """A change to a chat's messages (their content parts, a replayed tool call's arguments);
    returns its label."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    roll = rng.random()
    if roll < 0.5:
        part = json.loads(json.dumps(rng.choice(PARTS)))
        i = rng.randrange(len(messages))
        m = messages[i]
        if isinstance(m, dict):
            content = m.get("content")
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else []
            parts.insert(rng.randint(0, len(parts)), part)
            m["content"] = parts
        return f"messages[{i}] part {json.dumps(part)[:60]}"
    args = rng.choice(ODD_ARGUMENTS)
    if route in OPENAI_CONVERSATIONS:
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": args}}
        messages.insert(len(messages) - 1, {"role": "assistant", "content": "",
                                            "tool_calls": [call]})
        messages.insert(len(messages) - 1, {"role": "tool", "tool_call_id": "call_1",
                                            "content": "ok"})
        return f"tool call arguments {args}"
    # Anthropic's tool_use input is an object in the body: its numbers as typed.
    raw_input = {"n": rng.choice([Raw("123456789012345678901234567890"), Raw("-0"),
                                  float("nan"), float("inf"), Raw("1e400"), -0.0])}
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                             "name": "get_weather", "input": raw_input}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                           "content": "ok"}]}
    messages[len(messages) - 1:len(messages) - 1] = [use, result]
    return f"tool_use input {encode(raw_input).decode()}"


def make_case(i, route, models, rng, foreign):
    """Case `i` of `route`: a valid body of one of its `models` with one to three of its fields
    drawn anew, or (one time in ten) a field only other routes' models have (`foreign`), which
    vLLM ignores on this route."""
    model = rng.choice(models)
    body = base_body(route, model, rng)
    fields = {k: v for k, v in model.model_fields.items() if k not in NEVER}
    ignored = {k: v for k, v in foreign.items() if k not in fields}
    tags = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if route in CONVERSATIONS and rng.random() < 0.12:
            if route == BATCH:
                # One of its conversations (while they are a list), changed as a chat's.
                conversations = body.get("messages")
                label = None
                if isinstance(conversations, list) and conversations:
                    j = rng.randrange(len(conversations))
                    label = message_variant(CHAT, {"messages": conversations[j]}, rng)
                    label = label and f"conversation {j}: {label}"
            else:
                label = message_variant(route, body, rng)
            if label:
                tags.append(("messages", "variant", label))
            continue
        if ignored and rng.random() < 0.1:
            key = rng.choice(list(ignored))
            f = ignored[key]
        else:
            key = rng.choice(list(fields))
            f = fields[key]
        key = f.alias or key
        draw = Draw(rng)
        if rng.random() < 0.06:
            kind, value = "absent", None
            body.pop(key, None)
        else:
            kind, value = draw.value(f.annotation, key)
            if key == "model" and kind == "null" and rng.random() < 0.5:
                kind = "absent"
                body.pop("model", None)
            else:
                body[key] = value
        tags.append((key, kind, value))
    bom = rng.random() < 0.1
    if bom:
        tags.append(("body", "bom", None))
    # (Drawn only where a route has several paths: the generation routes' cases of a seed stay
    # the ones earlier runs sent.)
    path = rng.choice(PATHS[route]) if route in PATHS else route
    return {"name": f"fuzz {i}: {path} {model.__name__}", "path": path, "body": body,
            "bom": bom, "tags": tags, "index": i}


def small_limit(c):
    """The output limit of a generation body when it is a small whole number in any spelling
    pydantic reads (the gateway must forward what vLLM would allow), else None."""
    body = c["body"]
    fields = LIMITS.get(c["path"], ())
    set_ = [body.get(f) for f in fields if body.get(f) is not None]
    if not set_:
        return None
    try:
        n = int(float(set_[0])) if not isinstance(set_[0], (dict, list, Raw)) else None
    except (TypeError, ValueError, OverflowError):
        return None
    if n is not None and 1 <= n <= 16:
        return n
    return None


# Fields that can end an answer before its limit (or that the engine reads to stop): with one
# of them fuzzed, the output through the gateway is not compared with vLLM's own.
STOPPERS = {"stop", "stop_sequences", "stop_token_ids", "structured_outputs", "response_format",
            "logit_bias", "allowed_token_ids", "bad_words", "repetition_detection", "tool_choice",
            "text", "logprob_token_ids", "thinking_token_budget", "ignore_eos", "min_tokens"}


def brake(c):
    """Stop strings that end a random model's answer within a few tokens, unless the case
    fuzzes `stop` itself (then its output limit is kept small)."""
    body = c["body"]
    if c["path"] not in LIMITS or small_limit(c) is not None:
        return
    key = "stop_sequences" if c["path"] == MESSAGES else "stop"
    if any(t[0] == key for t in c["tags"]):
        for f in LIMITS[c["path"]]:
            body[f] = 4
        c["tags"].append((LIMITS[c["path"]][0], "kept small", 4))
        return
    body[key] = ["e", "a", " ", "\n"]
    c["braked"] = True


# ---------------------------------------------------------------------------------------------
# Sending.


def send(url, data, headers, timeout=180):
    """POSTs `data`; returns (status, content type, body bytes)."""
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("content-type", "application/json")
    for k, v in headers.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            ctype = r.headers.get("content-type", "")
            try:
                body = r.read()
                if ctype.startswith("application/octet-stream"):
                    # An embedding's `bytes` encoding: vLLM's usage is in the `metadata`
                    # header (none with `bytes_only`), which stands for the answer here.
                    body = (r.headers.get("metadata") or "{}").encode()
                return r.status, ctype, body
            except http.client.IncompleteRead as e:
                # The answer was cut by its server: what came, and a mark judge() reads.
                return r.status, ctype, e.partial + INCOMPLETE
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read()
    except (OSError, urllib.error.URLError, http.client.HTTPException) as e:
        return 599, "", str(e).encode()


# What send() appends to an answer its server cut short.
INCOMPLETE = b"\n\n(cut short by the server)"


def events_of(raw):
    """The data payloads of an SSE body (JSON where they parse)."""
    out = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data:"):
                data = line[5:].strip()
                try:
                    out.append(json.loads(data))
                except ValueError:
                    out.append(data.decode(errors="replace"))
    return out


def usage_of(status, ctype, raw):
    """vLLM's usage as the client received it (OpenAI's terms), or None."""
    if status != 200:
        return None
    if "event-stream" in ctype:
        events = events_of(raw)
        if any(isinstance(e, dict) and ("error" in e and e.get("type") != "response.completed")
               for e in events):
            return None
        return parity.vllm_usage(None, status, [e for e in events if isinstance(e, dict)])
    try:
        return parity.vllm_usage(None, status, raw)
    except (ValueError, AttributeError):
        return None


# How an answer says a sequence ran to its output limit (OpenAI's `finish_reason`, Anthropic's
# `stop_reason`, the Responses API's `incomplete_details.reason`).
AT_LIMIT = {"length", "max_tokens", "max_output_tokens"}


def ends(ctype, raw):
    """Why each of a generation's sequences ended, as its answer (or stream) says."""
    if "event-stream" in ctype:
        docs = [e for e in events_of(raw) if isinstance(e, dict)]
    else:
        try:
            docs = [json.loads(raw)]
        except ValueError:
            return []
    out = []
    for d in docs:
        out += [ch["finish_reason"] for ch in d.get("choices") or []
                if isinstance(ch, dict) and ch.get("finish_reason")]
        delta = d.get("delta") if isinstance(d.get("delta"), dict) else {}
        out += [r for r in (d.get("stop_reason"), delta.get("stop_reason")) if r]
        resp = d.get("response") if isinstance(d.get("response"), dict) else d
        if resp.get("object") == "response" and resp.get("status") in ("completed", "incomplete"):
            out.append((resp.get("incomplete_details") or {}).get("reason") or resp["status"])
    return out


def refused_in_stream(ctype, raw):
    """Whether a stream carried an error and no output."""
    if "event-stream" not in ctype or stream_error(ctype, raw) is None:
        return False
    return not any(isinstance(e, dict) and parity.delivers(e) for e in events_of(raw))


def usage_shape(ctype, raw):
    """Of a stream's events, whether any before the last carries usage (continuous usage), and
    whether the last does; None for an answer that is not a stream."""
    if "event-stream" not in ctype:
        return None
    events = [e for e in events_of(raw) if isinstance(e, dict)]
    usage = [bool(e.get("usage")) for e in events if "choices" in e]
    return (any(usage[:-1]), bool(usage) and usage[-1])


def stream_error(ctype, raw):
    """An error event inside a served stream, or None."""
    if "event-stream" not in ctype:
        return None
    for e in events_of(raw):
        if isinstance(e, dict) and e.get("type") in ("error",) or (
                isinstance(e, dict) and "error" in e and "choices" not in e):
            return json.dumps(e)[:300]
    return None


def run_case(c, port, vllm_url):
    rid = f"fuzz-{c['index']}"
    data = encode(c["body"], c["bom"])
    auth = {"x-api-key": KEY} if c["path"].startswith(MESSAGES) else {
        "authorization": f"Bearer {KEY}"}
    started = time.monotonic()
    gw = send(f"http://127.0.0.1:{port}{c['path']}", data, {**auth, "x-request-id": rid})
    direct = send(f"{vllm_url}{c['path']}", data, {})
    return {"case": c, "rid": rid, "gw": gw, "direct": direct,
            "seconds": time.monotonic() - started}


# ---------------------------------------------------------------------------------------------
# Judging.


def cls(status):
    return "served" if status < 300 else "refused" if status < 500 else "failed"


LOCAL_FIELDS = {TOKENIZE: ["count", "max_model_len", "tokens", "token_strs"],
                DETOKENIZE: ["prompt"], COUNT_TOKENS: ["input_tokens", "context_management"]}


def judge(r, line):
    """None when the gateway agrees with vLLM on this case, else (kind, what differs)."""
    c = r["case"]
    (gs, gct, graw), (vs, vct, vraw) = r["gw"], r["direct"]
    g, v = cls(gs), cls(vs)
    # A stream vLLM opens and then ends with an error and nothing else refused the body (its
    # checks after the headers); so for the gateway's.
    if v == "served" and refused_in_stream(vct, vraw):
        v = "refused"
    if vraw.endswith(INCOMPLETE):
        # vLLM broke its own stream: the gateway passes that on as an error event.
        v = "failed"
    if g == "served" and refused_in_stream(gct, graw):
        g = "refused"
    if v == "failed" or (g == "failed" and gs != 599 and v == "refused"):
        # The engine fails the body (or refuses it and the gateway passes a failure on): no
        # output either way.
        return None
    if g != v:
        return (f"gateway {g}", f"gateway {gs} {graw[:240]!r}, vLLM {vs} {vraw[:240]!r}")
    if g != "served":
        return None
    if c["path"] in LOCAL_FIELDS:
        fields = LOCAL_FIELDS[c["path"]]
        got, want = json.loads(graw), json.loads(vraw)
        diff = {f: (got.get(f), want.get(f)) for f in fields if got.get(f) != want.get(f)}
        return ("local", f"{diff}"[:400]) if diff else None
    if graw.endswith(INCOMPLETE) and not vraw.endswith(INCOMPLETE):
        return ("stream", f"the gateway's answer was cut short: {graw[-300:]!r}")
    err = stream_error(gct, graw)
    if err and not stream_error(vct, vraw):
        return ("stream", f"gateway's stream ended with {err}")
    if usage_shape(gct, graw) != usage_shape(vct, vraw):
        return ("usage", f"events with usage (before the last, the last): through the gateway "
                         f"{usage_shape(gct, graw)}, straight to vLLM {usage_shape(vct, vraw)}")
    gu, vu = usage_of(gs, gct, graw), usage_of(vs, vct, vraw)
    if line is None:
        return ("log", "no usage-log line")
    counted = line.get("counted_prompt_tokens")
    diffs = []
    if vu is not None and counted != vu.get("prompt_tokens"):
        diffs.append(("prompt", f"prompt: gateway {counted}, vLLM {vu.get('prompt_tokens')}"))
    if gu is not None and line.get("output_tokens") != gu.get("completion_tokens"):
        diffs.append(("output", f"output: metered {line.get('output_tokens')}, its answer said "
                                f"{gu.get('completion_tokens')}"))
    if gu is None and vu is not None and "event-stream" not in gct:
        diffs.append(("usage", "the gateway's answer carried no usage"))
    # Compared only where every sequence, both ways, ran to its limit: a sampled sequence that
    # ends early (its end-of-turn token drawn) is the model's, on either side.
    if (not c.get("braked") and small_limit(c) is not None and gu and vu
            and not any(t[0] in STOPPERS for t in c["tags"])
            and all(e in AT_LIMIT for e in ends(gct, graw) + ends(vct, vraw))
            and gu.get("completion_tokens") != vu.get("completion_tokens")):
        diffs.append(("limit", f"output: through the gateway {gu.get('completion_tokens')}, "
                               f"straight to vLLM {vu.get('completion_tokens')}"))
    return diffs[0] if diffs else None


def as_int(v):
    """`v` as pydantic reads an int, or None."""
    from pydantic import TypeAdapter, ValidationError
    try:
        return TypeAdapter(int).validate_python(v)
    except (ValidationError, TypeError):
        return None


def tagged(c, key, pred=lambda kind, value: True):
    return any(k == key and pred(kind, v) for k, kind, v in c["tags"])


def multimodal_score_input(c):
    """A score or rerank body with a multimodal input (`{"content": [...]}`, or a list holding
    one) in one of its text fields."""
    if c["path"] not in PATHS[SCORE] + PATHS[RERANK]:
        return False
    body = c["body"]
    fields = ("query", "queries", "documents", "items", "data_1", "data_2", "text_1", "text_2")
    return any(isinstance(v, dict) or (isinstance(v, list) and any(isinstance(x, dict) for x in v))
               for v in (body.get(f) for f in fields))


def as_bool(v):
    """`v` as pydantic reads a bool, or None."""
    from pydantic import TypeAdapter, ValidationError
    try:
        return TypeAdapter(bool).validate_python(v)
    except (ValidationError, TypeError):
        return None


def truthy_set(key):
    """A fuzzed `key` whose value is not None, false or empty."""
    return lambda c: tagged(c, key, lambda kind, v: v not in (None, False, 0, "", [], {})
                            and kind != "absent")


# Differences kept on purpose (docs/vllm-parity.md, "Known differences"): (name, the kind of
# difference it explains, when it applies, why). A difference a rule explains must be of the
# rule's kind; every other difference fails the run.
KNOWN = [
    ("a streamed batch of chats", "gateway refused",
     lambda c: c["path"] == BATCH and as_bool(c["body"].get("stream")) is True,
     "vLLM answers it whole, with each conversation's last piece only and its usage short"),
    ("a text part without text on /tokenize", "gateway served",
     lambda c: c["path"] == TOKENIZE
     and tagged(c, "messages", lambda kind, v: isinstance(v, str) and '"text": null' in v),
     "the gateway renders it as vLLM's renderer does (as nothing); vLLM's /tokenize request "
     "model refuses it first, and its generating routes refuse it to the gateway"),
    ("truncate_prompt_tokens cutting an echoed prompt", "gateway refused",
     lambda c: c["path"] == COMPLETIONS
     and c["body"].get("truncate_prompt_tokens") is not None
     and c["body"].get("echo") not in (None, False, 0, "false", "0"),
     "the answer would repeat the cut prompt, which the gateway does not know"),
    ("use_beam_search", "gateway refused", truthy_set("use_beam_search"),
     "a beam search decodes several sequences"),
    ("a negative priority", "gateway refused",
     lambda c: tagged(c, "priority", lambda kind, v: as_int(v) is not None and as_int(v) < 0),
     "with vLLM's priority scheduling it would lift a request above its class"),
    ("mm_processor_kwargs", "gateway refused", truthy_set("mm_processor_kwargs"),
     "it changes how images become tokens"),
    ("media_io_kwargs", "gateway refused", truthy_set("media_io_kwargs"),
     "it changes how media are read"),
    ("chat_template", "gateway refused", truthy_set("chat_template"),
     "a request's own template is not counted"),
    ("drawn messages beside an input", "gateway refused",
     lambda c: c["path"] in (EMBEDDINGS, POOLING) and "input" in c["body"]
     and tagged(c, "messages", lambda kind, v: kind != "variant"),
     "vLLM's union of request models runs the input when pydantic refuses a message (a tool "
     "call without its id, say); the gateway does not check each message as pydantic does, "
     "and refuses what it cannot render"),
    ("a multimodal score or rerank input", "gateway refused", multimodal_score_input,
     "the gateway does not count a pooling backend's images"),
    ("vllm_xargs", "gateway refused",
     lambda c: tagged(c, "vllm_xargs", lambda kind, v: v is not None and kind != "absent"),
     "arguments to the engine's own extensions are the deployment's to set"),
]


def explain(c, kind):
    """The known rule that explains a difference of `kind` on `c`, or a string saying which
    rule applied and expected another kind, or None."""
    applied = [k for k in KNOWN if k[2](c)]
    for name, expected, _, why in applied:
        if kind == expected:
            return name
    return None


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--vllm-url", required=True)
    ap.add_argument("--cases", type=int, default=5000)
    ap.add_argument("--later-cases", type=int, default=600,
                    help="cases of the later routes (the batch of chats, generative scoring; "
                         "with --pooling, Cohere's /v2/embed), after the others")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--route", help="only this route's cases")
    ap.add_argument("--show", type=int, default=40, help="differences printed, at most")
    ap.add_argument("--slowest", type=int, default=0, help="the slowest cases, printed")
    ap.add_argument("--only", type=int, action="append",
                    help="only the case of this index (repeatable); its answers are printed")
    ap.add_argument("--pooling", action="store_true",
                    help="the pooling routes, against vLLM's pooling runner")
    a = ap.parse_args()

    t0 = time.monotonic()
    models = pooling_models() if a.pooling else engine_models()
    rng = random.Random(a.seed)
    table = POOLING_ROUTES if a.pooling else ROUTES
    routes = [r for r, _ in table]
    weights = [w for _, w in table]
    # Every field of every route's model, for the fields vLLM ignores on a route.
    foreign = {k: f for ms in models.values() for m in ms for k, f in m.model_fields.items()
               if k not in NEVER}
    cases = []
    for i in range(a.cases):
        route = rng.choices(routes, weights)[0]
        c = make_case(i, route, models[route], rng, foreign)
        brake(c)
        if (a.route is None or a.route == route) and (a.only is None or i in a.only):
            cases.append(c)
    # The later routes, from a generator of their own: the cases above are a seed's as before.
    later_rng = random.Random(f"later {a.seed}")
    later = later_models(a.pooling)
    later_table = POOLING_LATER_ROUTES if a.pooling else LATER_ROUTES
    for i in range(a.cases, a.cases + a.later_cases):
        route = later_rng.choices([r for r, _ in later_table], [w for _, w in later_table])[0]
        c = make_case(i, route, later[route], later_rng, foreign)
        brake(c)
        if a.route in (None, route) and (a.only is None or i in a.only):
            cases.append(c)
    t_made = time.monotonic()

    work = Path(tempfile.mkdtemp(prefix="tokengate-fuzz-"))
    log = work / "usage.jsonl"
    port, admin_port = harness.free_port(), harness.free_port()
    procs = harness.Procs()
    try:
        generator = None
        if a.pooling:
            # vLLM pools; a gateway needs a generating backend too: the simulator.
            sim_port = harness.free_port()
            generator = f"http://127.0.0.1:{sim_port}"
            sim = procs.start([a.gateway, "sim", "--listen", f"127.0.0.1:{sim_port}",
                               "--tokenizer", str(parity.ROOT / "assets" / "qwen3.5"
                                                  / "tokenizer.json")],
                              open(work / "sim.log", "w"))
            harness.wait_http(f"{generator}/health", 30, sim)
        (work / "gateway.toml").write_text(
            parity.gateway_config(a.vllm_url, port, admin_port, log, generator))
        gw = procs.start([a.gateway, "serve", "--config", str(work / "gateway.toml")],
                         open(work / "gateway.log", "w"))
        harness.wait_http(f"http://127.0.0.1:{admin_port}/readyz", 30, gw)
        t_up = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            results = list(pool.map(lambda c: run_case(c, port, a.vllm_url), cases))
        t_sent = time.monotonic()
        # A body that kills the engine would make every later case a "failure" both agree on:
        # the run counts only while vLLM lives.
        try:
            harness.get(f"{a.vllm_url}/health", timeout=10)
        except OSError as e:
            sys.exit(f"schema fuzz: vLLM is not healthy after the run ({e}); its log says why")
        served = [r["rid"] for r in results if r["gw"][0] == 200
                  and r["case"]["path"] not in LOCAL_FIELDS]
        lines, _ = parity.read_log(log, served)
    finally:
        procs.stop_all()

    unexplained, known = [], collections.Counter()
    outcomes = collections.Counter()
    for r in results:
        c = r["case"]
        outcomes[(c["path"], cls(r["gw"][0]), cls(r["direct"][0]))] += 1
        diff = judge(r, lines.get(r["rid"]))
        if diff is None:
            continue
        rule = explain(c, diff[0])
        if rule is not None:
            known[rule] += 1
            continue
        unexplained.append((c, diff))
    t_judged = time.monotonic()

    for r in results if a.only else []:
        print(f"case {r['case']['index']}: body {encode(r['case']['body'])!r}")
        print(f"  gateway {r['gw'][0]} {r['gw'][2][-2000:]!r}")
        print(f"  vLLM {r['direct'][0]} {r['direct'][2][-2000:]!r}")
    for (path, g, v), n in sorted(outcomes.items()):
        print(f"schema fuzz: {path}: gateway {g}, vLLM {v}: {n}")
    slowest = sorted(results, key=lambda r: -r["seconds"])[:a.slowest]
    for r in slowest:
        tags = "; ".join(f"{k}={kind_}" for k, kind_, _ in r["case"]["tags"])
        print(f"schema fuzz: slow: {r['seconds']:.1f} s {r['case']['name']} [{tags}]")
    for rule, n in sorted(known.items()):
        print(f"schema fuzz: known ({rule}): {n}")
    for c, (kind, what) in unexplained[:a.show]:
        tags = "; ".join(f"{k}={kind_}:{json.dumps(v, default=str)[:60]}"
                         for k, kind_, v in c["tags"])
        print(f"DIFF {c['name']} [{kind}] {tags}\n    {what}\n    body {encode(c['body'])[:300]!r}")
    print(f"schema fuzz: {len(cases)} cases made in {t_made - t0:.1f} s (vLLM's models "
          f"imported), gateway up in {t_up - t_made:.1f} s, sent in {t_sent - t_up:.1f} s, "
          f"judged in {t_judged - t_sent:.1f} s")
    print(f"schema fuzz: {len(cases)} cases, {len(unexplained) + sum(known.values())} "
          f"differences ({sum(known.values())} known)")
    if unexplained:
        print(f"schema fuzz: the gateway's log is in {work}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
