"""The parity suite: what tokengate charges equals what a real vLLM counts.

Every request shape the gateway accepts goes through a gateway to a real vLLM (scripts/vllm-serve:
vLLM 0.32's own OpenAI server with a toy Qwen3.5 made from the real tokenizer and the official chat
template), and for each request the gateway's usage-log line is compared with vLLM's own `usage`:
the prompt tokens the gateway counted before forwarding (`counted_prompt_tokens`) and the output it
metered (`output_tokens`) against `usage.prompt_tokens` and `usage.completion_tokens`. A request
the gateway refuses is sent to vLLM directly: if vLLM serves it, that is a difference too.

The cases are the named ones (the shapes once found charged differently from vLLM, the edges of each
route, and the engine's edges that the schema fuzzer's first runs found: `edge_cases`) and
`--cases` more generated from `--seed`. A difference the project keeps on purpose
is listed in KNOWN with its reason (docs/vllm-parity.md) and asserted to still be that difference.

    python tests/vllm/parity.py --gateway BINARY --vllm-url URL [--cases N] [--seed S] [--only NAME]
    python tests/vllm/parity.py --pooling --gateway BINARY --vllm-url URL [--cases N] [--seed S]

`--pooling` runs the pooling routes' cases (`/v1/embeddings`, `/pooling`, `/score`, `/rerank`,
`/v2/embed`)
instead, against a vLLM serving the model with its pooling runner (scripts/vllm-serve --pooling),
declared `runner = "pooling"` beside a simulated generator (`tokengate sim`).

Run with the vLLM venv's Python (it has Pillow for the images). Prints each part's time and ends
with `parity: N passed, M failed`; exits 1 on any failure.
"""

import argparse
import base64
import concurrent.futures
import importlib.metadata
import io
import json
import os
import random
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

import harness  # noqa: E402
import gen_chat_fixtures as material  # noqa: E402

MODEL = "qwen3.5-27b"
KEY = "sk-parity"
# Context of the toy model's server (scripts/vllm-serve --max-model-len) and so of the gateway.
MAX_MODEL_LEN = 32768
# The vLLM this Python runs with, which the gateway's backend declares (its handling of an
# output limit past the context follows the version).
VLLM_VERSION = importlib.metadata.version("vllm")


def post(url, body, headers=None, timeout=120):
    """POSTs JSON; returns (status, headers, body bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST")
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def stream(host, port, path, body, headers, cut_after):
    """POSTs a streamed request on a raw socket and reads its SSE events; with `cut_after`,
    closes the connection once that many events with a choice have arrived. Returns (status,
    list of parsed data payloads, whether it was cut)."""
    payload = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", "content-type: application/json",
            f"content-length: {len(payload)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    s = socket.create_connection((host, port), timeout=120)
    s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    f = s.makefile("rb")
    status = int(f.readline().split()[1])
    chunked = False
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.decode().partition(":")
        if k.strip().lower() == "transfer-encoding" and "chunked" in v.lower():
            chunked = True

    def body_bytes():
        if not chunked:
            while True:
                b = f.read1(65536)
                if not b:
                    return
                yield b
        while True:
            size = int(f.readline().strip() or b"0", 16)
            if size == 0:
                return
            yield f.read(size)
            f.readline()

    events, buf, cut = [], b"", False
    if status != 200:
        raw = b"".join(body_bytes())
        s.close()
        return status, raw.decode(errors="replace")[:400], False
    try:
        for b in body_bytes():
            buf += b
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if line.startswith(b"data: "):
                        data = line[6:].decode()
                        events.append(data if data == "[DONE]" else json.loads(data))
                if status != 200:
                    continue
                chosen = [e for e in events if isinstance(e, dict) and delivers(e)]
                if cut_after is not None and len(chosen) >= cut_after:
                    cut = True
                    raise StopIteration
    except StopIteration:
        pass
    finally:
        s.close()
    return status, events, cut


def delivers(event):
    """Whether a stream event carries output: an OpenAI chunk with a choice, an Anthropic
    `content_block_delta`, a Responses API `*.delta` event."""
    return bool(event.get("choices")) or event.get("type") == "content_block_delta" \
        or str(event.get("type", "")).endswith(".delta")


def as_openai_usage(u):
    """Usage in OpenAI's terms: the Responses API's `input_tokens` is the whole prompt;
    Anthropic's (vLLM's `/v1/messages`) is its input plus what the cache read and wrote."""
    if u is None:
        return u
    if "input_tokens" not in u:
        # A pooling answer generates nothing; vLLM's rerank usage leaves completion_tokens out.
        return {"completion_tokens": 0, **u}
    if "input_tokens_details" in u:
        # The Responses API's: `input_tokens` is the whole prompt.
        return {"prompt_tokens": u["input_tokens"], "completion_tokens": u.get("output_tokens"),
                "prompt_tokens_details": u["input_tokens_details"]}
    prompt = u["input_tokens"] + (u.get("cache_read_input_tokens") or 0) \
        + (u.get("cache_creation_input_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": u.get("output_tokens"),
            "prompt_tokens_details": {"cached_tokens": u.get("cache_read_input_tokens")}}


# ---------------------------------------------------------------------------------------------
# Images: real files (vLLM decodes their pixels), made with Pillow.


def image_url(width, height, fmt="PNG", rng=None):
    from PIL import Image

    rng = rng or random.Random(width * 7919 + height)
    img = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    img.save(out, format=fmt)
    mime = {"PNG": "png", "JPEG": "jpeg", "GIF": "gif", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(out.getvalue()).decode()


def gif_outgrowing_screen(width, height):
    """A GIF whose logical screen says 1x1 and whose first frame is width x height: Pillow
    grows the canvas to the frame."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (40, 90, 200)).save(out, format="GIF")
    data = bytearray(out.getvalue())
    data[6:10] = (1).to_bytes(2, "little") + (1).to_bytes(2, "little")
    return "data:image/gif;base64," + base64.b64encode(bytes(data)).decode()


def video_part(frames, width, height):
    """A video given as JPEG frames, the form vLLM takes: data:video/jpeg;base64,f1,f2,..."""
    from PIL import Image

    encoded = []
    for i in range(frames):
        out = io.BytesIO()
        Image.new("RGB", (width, height), (i * 3 % 256, 80, 160)).save(out, format="JPEG")
        encoded.append(base64.b64encode(out.getvalue()).decode())
    return {"type": "video_url", "video_url": {"url": "data:video/jpeg;base64," + ",".join(encoded)}}


def image_part(width, height, fmt="PNG", rng=None):
    return {"type": "image_url", "image_url": {"url": image_url(width, height, fmt, rng)}}


# ---------------------------------------------------------------------------------------------
# Cases.


def chat(messages, max_tokens=2, stream_=False, **extra):
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream_}
    if stream_:
        body["stream_options"] = {"include_usage": True}
    body.update(extra)
    return body


def case(name, body, path="/v1/chat/completions", cut_after=None, continuous=True,
         direct=False, alone=False, clamped=None, no_usage=False):
    """A request; `cut_after`: the client closes its stream after that many chunks. A cut
    stream asks for continuous usage (each chunk then says what vLLM had generated by it), or,
    `continuous=False`, does not (what most clients do): it is then sampled greedily, and the
    same request sent straight to vLLM with continuous usage, cut at the same chunk, tells what
    was generated. `direct`: the same request is also sent straight to vLLM, and the output the
    gateway charged must equal what vLLM generates for it there (the gateway's defaults are the
    engine's). `alone`: sent after the rest, with nothing else in flight. `clamped`: the output
    limit asked, past what the context leaves: the gateway must reserve (and forward) what vLLM
    allows, min(asked, context - prompt). `no_usage`: a stream whose client declined usage: no
    event it receives may carry any (the counts are then vLLM's for the same body sent straight
    to it, not streamed)."""
    if body is not None and not isinstance(body, bytes) and no_usage:
        direct = True
    if cut_after is not None:
        if continuous:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        else:
            body.pop("stream_options", None)
            body["temperature"] = 0
    return {"name": name, "path": path, "body": body, "cut_after": cut_after,
            "continuous": continuous, "direct": direct, "clamped": clamped, "no_usage": no_usage,
            "alone": alone or (cut_after is not None and not continuous)}


U = {"role": "user", "content": "What is the capital of France?"}
A = {"role": "assistant", "content": "Paris."}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]},
    },
}


def named_cases():
    """The shapes once charged differently from vLLM and the edges of each route, by name."""
    no_desc = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}
    extra_keys = json.loads(json.dumps(WEATHER))
    extra_keys["function"]["strict"] = True
    extra_keys["function"]["x-vendor"] = {"a": 1}
    long_reasoning = " ".join(material.REASONINGS) * 2
    cases = [
        case("plain chat", chat([U])),
        case("plain chat, streamed", chat([U], 4, True)),
        case("system + user", chat([{"role": "system", "content": "You are terse."}, U])),
        case("developer role", chat([{"role": "developer", "content": "You are terse."}, U])),
        case("two system messages, one mid-conversation",
             chat([{"role": "system", "content": "Be brief."}, U, A,
                   {"role": "system", "content": "Now answer in French."}, U])),
        case("assistant turn with reasoning",
             chat([U, {"role": "assistant", "content": "Paris.", "reasoning": long_reasoning},
                   {"role": "user", "content": "And of Italy?"}])),
        case("assistant turn with reasoning_content",
             chat([U, {"role": "assistant", "content": "Paris.",
                       "reasoning_content": long_reasoning},
                   {"role": "user", "content": "And of Italy?"}])),
        case("two system messages at the front",
             chat([{"role": "system", "content": "Be brief."},
                   {"role": "system", "content": "Answer in French."}, U])),
        case("developer then system",
             chat([{"role": "developer", "content": "Be brief."},
                   {"role": "system", "content": "Answer in French."}, U])),
        case("system then developer",
             chat([{"role": "system", "content": "Be brief."},
                   {"role": "developer", "content": "Answer in French."}, U])),
        case("developer mid-conversation",
             chat([U, A, {"role": "developer", "content": "Answer in French."}, U])),
        case("reasoning in a tool loop after the last user turn",
             chat([U, {"role": "assistant", "content": "", "reasoning": long_reasoning,
                       "tool_calls": [{"id": "call_1", "type": "function", "function": {
                           "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}],
                  tools=[WEATHER])),
        case("reasoning_content in a tool loop after the last user turn",
             chat([U, {"role": "assistant", "content": "",
                       "reasoning_content": long_reasoning,
                       "tool_calls": [{"id": "call_1", "type": "function", "function": {
                           "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}],
                  tools=[WEATHER])),
        case("tool without description", chat([U], tools=[no_desc])),
        case("tool with extra keys", chat([U], tools=[extra_keys])),
        case("tools and a tool call with its result",
             chat([U, {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}],
                  tools=[WEATHER])),
        case("tool message with list content",
             chat([U, {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_1", "type": "function",
                  "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                   {"role": "tool", "tool_call_id": "call_1",
                    "content": [{"type": "text", "text": "Sunny, 21 C"}]}], tools=[WEATHER])),
        case("enable_thinking false",
             chat([U], chat_template_kwargs={"enable_thinking": False})),
        case("continue_final_message",
             chat([U, {"role": "assistant", "content": "The capital is"}],
                  add_generation_prompt=False, continue_final_message=True)),
        case("add_generation_prompt false", chat([U, A], add_generation_prompt=False)),
        case("list content parts", chat([{"role": "user", "content": [
            {"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}])),
        case("n 2", chat([U], 8, n=2)),
        case("n 2, streamed", chat([U], 8, True, n=2)),
        case("n 3, completions", {"model": MODEL, "prompt": "Once upon", "max_tokens": 4, "n": 3},
             "/v1/completions"),
        case("a batch of text prompts", {"model": MODEL, "prompt": ["Once upon", U["content"]],
                                         "max_tokens": 3}, "/v1/completions"),
        case("a batch of token-id prompts, n 2", {"model": MODEL, "prompt": [[9707, 1879], [11]],
                                                  "max_tokens": 2, "n": 2}, "/v1/completions"),
        case("a batch streamed", {"model": MODEL, "prompt": ["a", "b c", "<|im_start|>d"],
                                  "max_tokens": 2, "stream": True,
                                  "stream_options": {"include_usage": True}}, "/v1/completions"),
        case("n 2, completions streamed", {"model": MODEL, "prompt": "Once upon", "max_tokens": 3,
                                            "n": 2, "stream": True,
                                            "stream_options": {"include_usage": True}},
             "/v1/completions"),
        case("stream cut after 5 events", chat([U], 40, True), cut_after=5),
        case("stream cut after 59 reasoning events", chat([U], 120, True), cut_after=59),
        case("stream cut at the first event", chat([U], 40, True), cut_after=1),
        case("stream cut after 7 events, no usage asked", chat([U], 40, True), cut_after=7,
             continuous=False),
        case("stream cut after 59 reasoning events, no usage asked", chat([U], 120, True),
             cut_after=59, continuous=False),
        # vLLM would allow up to the context; the gateway forwards its default (docs).
        case("chat without max_tokens", {"model": MODEL, "messages": [U]}),
        case("max_completion_tokens", {"model": MODEL, "messages": [U],
                                       "max_completion_tokens": 3}),
        case("an image 64x64", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "What is this?"}]}])),
        case("an image 300x200 JPEG", chat([{"role": "user", "content": [
            image_part(300, 200, "JPEG"), {"type": "text", "text": "Describe."}]}])),
        case("an image 640x480 WebP", chat([{"role": "user", "content": [
            image_part(640, 480, "WEBP"), {"type": "text", "text": "Describe."}]}])),
        case("an image 100x40 GIF", chat([{"role": "user", "content": [
            image_part(100, 40, "GIF"), {"type": "text", "text": "Describe."}]}])),
        case("two images", chat([{"role": "user", "content": [
            image_part(128, 96), image_part(96, 128), {"type": "text", "text": "Compare."}]}])),
        case("an image 1x1 (resized up)", chat([{"role": "user", "content": [
            image_part(1, 1), {"type": "text", "text": "?"}]}])),
        case("an image in a GIF whose first frame outgrows its screen", chat([
            {"role": "user", "content": [{"type": "image_url", "image_url": {
                "url": gif_outgrowing_screen(96, 64)}}, {"type": "text", "text": "?"}]}])),
        case("a video of 4 JPEG frames", chat([{"role": "user", "content": [
            video_part(4, 64, 64), {"type": "text", "text": "What happens?"}]}])),
        case("a video of 64 JPEG frames", chat([{"role": "user", "content": [
            video_part(64, 64, 64), {"type": "text", "text": "What happens?"}]}])),
        case("mm_processor_kwargs min_pixels", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "?"}]}],
            mm_processor_kwargs={"min_pixels": 1048576})),
        case("chat_template_kwargs reasoning_effort",
             chat([U], chat_template_kwargs={"reasoning_effort": "low"})),
        # vLLM hands the template only the arguments it reads: the others change nothing.
        case("chat_template_kwargs the template does not read", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "?"}]}], chat_template_kwargs={
                "enable_thinking": False, "thinking": False, "min_pixels": 1, "tokenize": True,
                "documents": [{"title": "A", "text": "B"}], "content": "x",
                "reasoning_content": "y", "raise_exception": 1})),
        case("chat_template_kwargs add_vision_id", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "?"}]}, A, {"role": "user", "content": [
                image_part(96, 64), video_part(4, 64, 64), {"type": "text", "text": "And?"}]}],
            chat_template_kwargs={"add_vision_id": True})),
        # The template tests its truth, as Python does: 1 and "no" are true, [] is false.
        case("chat_template_kwargs add_vision_id not a boolean", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "?"}]}],
            chat_template_kwargs={"add_vision_id": 1})),
        case("chat_template_kwargs add_vision_id as a text", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "?"}]}],
            chat_template_kwargs={"add_vision_id": "no"})),
        case("chat_template_kwargs add_vision_id an empty list", chat([{"role": "user", "content": [
            image_part(64, 64), {"type": "text", "text": "?"}]}],
            chat_template_kwargs={"add_vision_id": []})),
        case("chat_template_kwargs tools", chat([U], chat_template_kwargs={"tools": [WEATHER]})),
        # The template tests `enable_thinking is false`: "false" thinks, as if nothing was sent.
        case("chat_template_kwargs enable_thinking as a text", chat(
            [U], reasoning_effort="none", chat_template_kwargs={"enable_thinking": "false"})),
        case("chat_template_kwargs enable_thinking as a list",
             chat([U], chat_template_kwargs={"enable_thinking": [False]})),
        case("chat_template_kwargs messages", chat([U], chat_template_kwargs={"messages": []})),
        case("reasoning_effort", chat([U], reasoning_effort="low")),
        case("documents", chat([U], documents=[{"title": "A", "text": "Paris is in France."}])),
        case("truncate_prompt_tokens", chat([U], truncate_prompt_tokens=5)),
        case("truncate_prompt_tokens from the left, as a string",
             chat([U, A, U], truncate_prompt_tokens="7", truncation_side="left")),
        case("truncate_prompt_tokens -1", chat([U], truncate_prompt_tokens=-1)),
        case("truncate_prompt_tokens past the prompt", chat([U], truncate_prompt_tokens=500)),
        case("truncate_prompt_tokens 0", chat([U], truncate_prompt_tokens=0)),
        case("truncate_prompt_tokens past the context",
             chat([U], truncate_prompt_tokens=MAX_MODEL_LEN + 1)),
        case("truncation_side unknown", chat([U], truncate_prompt_tokens=5, truncation_side="mid")),
        case("truncate_prompt_tokens of a batch of completions",
             {"model": MODEL, "prompt": ["Once upon a time there was a king", "Hello there"],
              "max_tokens": 2, "truncate_prompt_tokens": 4}, "/v1/completions"),
        case("truncate_prompt_tokens of token ids",
             {"model": MODEL, "prompt": [[9707, 1879, 11, 1246, 525, 498]], "max_tokens": 2,
              "truncate_prompt_tokens": 3}, "/v1/completions"),
        case("truncate_prompt_tokens cutting a prompt with an image", chat([{"role": "user", "content": [
            {"type": "text", "text": "Describe this picture in a few words, please. " * 8},
            # An image of its own: a body vLLM refuses after reading its images can leave its
            # engine's image cache behind its frontend's (a later body with the same image fails).
            image_part(72, 48)]}], truncate_prompt_tokens=100)),
        case("truncate_prompt_tokens cutting an echoed prompt",
             {"model": MODEL, "prompt": "Once upon a time there was a king", "max_tokens": 2,
              "echo": True, "truncate_prompt_tokens": 4}, "/v1/completions"),
        # vLLM 0.32 has no best_of: one sequence, as the gateway reserves it (vllm_version is
        # declared 0.32).
        case("best_of 2", {"model": MODEL, "prompt": "Once", "max_tokens": 2, "best_of": 2},
             "/v1/completions"),
        case("best_of as a text, on a chat", chat([U], best_of="abc")),
        case("use_beam_search", chat([U], use_beam_search=True)),
        # Sent as bytes: vLLM gets the same stream options (a refused case's body goes to it
        # unstreamed otherwise).
        case("a stream option that is not a boolean", json.dumps(chat(
            [U], 2, True, stream_options={"include_usage": True, "continuous_usage_stats": "maybe"}
        )).encode()),
        case("add_generation_prompt and continue_final_message both truthy as sent", chat(
            [U, {"role": "assistant", "content": "Hi"}], add_generation_prompt="no",
            continue_final_message="on")),
        case("body priority", chat([U], priority=-10)),
        case("vllm_xargs", chat([U], vllm_xargs={"x": 1})),
        case("request-level chat_template", chat([U], chat_template="{{ messages[0].content }}")),
        case("completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3},
             "/v1/completions"),
        case("completions without max_tokens", {"model": MODEL, "prompt": "Once upon a time"},
             "/v1/completions", direct=True),
        case("completions, streamed", {"model": MODEL, "prompt": "Once upon a time",
                                       "max_tokens": 5, "stream": True,
                                       "stream_options": {"include_usage": True}},
             "/v1/completions"),
        case("completions with token ids", {"model": MODEL, "prompt": [9707, 11, 1879],
                                            "max_tokens": 2}, "/v1/completions"),
        # One token prefilled alone in a step killed vLLM 0.32's CPU engine until
        # scripts/lib/vllm_cpu mended it: this case keeps the mend honest.
        case("completions of a one-token prompt, alone in its batch",
             {"model": MODEL, "prompt": [9707], "max_tokens": 2}, "/v1/completions",
             direct=True, alone=True),
        case("completions cut after 3 events", {"model": MODEL, "prompt": "Count: 1, 2,",
                                                "max_tokens": 30, "stream": True,
                                                "stream_options": {"include_usage": True}},
             "/v1/completions", cut_after=3),
    ]
    return (cases + messages_cases() + responses_cases() + edge_cases() + batch_cases()
            + scoring_cases())


BATCH = "/v1/chat/completions/batch"
SCORING = "/generative_scoring"


def scoring_cases():
    """vLLM's generative scoring: a query joined to each item, tokenized apart, each cut to
    the context less one token and run for one token."""
    body = lambda query, items, **extra: {"model": MODEL, "query": query, "items": items,
                                          "label_token_ids": [9707, 2152], **extra}
    return [
        case("generative scoring: texts", body("Is this review positive?",
                                               ["Great food.", "Cold and late.", ""]), SCORING),
        case("generative scoring: token ids", body([9707, 11, 1879], [[4, 5], [6]]), SCORING),
        case("generative scoring: a text query, items of token ids",
             body("Is this review positive?", [[4, 5], [6]]), SCORING),
        case("generative scoring: a word split between the query and an item",
             body("Is this good", ["ness", " food?"]), SCORING),
        case("generative scoring: item first",
             body("Is this review positive?", ["Great food."], item_first=True), SCORING),
        case("generative scoring: an empty query", body("", ["Great food."]), SCORING),
        case("generative scoring: each prompt cut to the context",
             body(long_text(20000), ["Great food.", long_text(14000)]), SCORING),
        case("generative scoring: max_tokens and stream passed over",
             body("q", ["a"], max_tokens=50, stream=False, n=3), SCORING),
        case("generative scoring: lax booleans",
             body("q", ["a"], apply_softmax="false", add_special_tokens=0), SCORING),
        case("generative scoring: model left out",
             {"query": "q", "items": ["a"], "label_token_ids": [1]}, SCORING),
        case("generative scoring: no items", body("q", []), SCORING),
        case("generative scoring: texts and token ids mixed", body("q", ["a", [1]]), SCORING),
        case("generative scoring: both empty", body("", ["a", ""]), SCORING),
        case("generative scoring: no label", {"model": MODEL, "query": "q", "items": ["a"]},
             SCORING),
        case("generative scoring: empty label", body("q", ["a"]) | {"label_token_ids": []},
             SCORING),
        case("generative scoring: a label past the vocabulary",
             body("q", ["a"]) | {"label_token_ids": [999999]}, SCORING),
        case("generative scoring: a negative token id", body([-1], ["a"]), SCORING),
        case("generative scoring: a cache_salt vLLM refuses", body("q", ["a"], cache_salt="a/b"),
             SCORING),
    ]


def batch_cases():
    """vLLM's batch of chats: each conversation a prompt of its own, rendered without the
    body's tools and documents, answered whole."""
    q = lambda text: [{"role": "user", "content": text}]
    two = [[U], [U, A, {"role": "user", "content": "And of Italy?"}]]
    past = MAX_MODEL_LEN
    return [
        case("batch: two conversations", chat(two), BATCH),
        case("batch: one conversation", chat([[U]]), BATCH),
        case("batch: tools and documents are not rendered",
             chat(two, tools=[WEATHER], documents=[{"title": "a", "text": "b"}]), BATCH),
        case("batch: thinking off, by reasoning_effort",
             chat([q("hi"), q("hello there")], reasoning_effort="none"), BATCH),
        case("batch: thinking off, by chat_template_kwargs",
             chat([q("hi"), q("hello there")], chat_template_kwargs={"enable_thinking": False}),
             BATCH),
        case("batch: max_completion_tokens over max_tokens",
             {"model": MODEL, "messages": two, "max_completion_tokens": 1, "max_tokens": 5},
             BATCH),
        case("batch: no output limit",
             {"model": MODEL, "messages": two, "stop": BRAKE, "temperature": 0}, BATCH),
        case("batch: max_tokens past what the context leaves",
             {"model": MODEL, "messages": [[U]], "max_tokens": past, "stop": BRAKE}, BATCH,
             clamped=past),
        case("batch: truncate_prompt_tokens cuts each conversation",
             chat([[U], [U, A, {"role": "user", "content": "And of Italy?"}]],
                  truncate_prompt_tokens=5), BATCH),
        case("batch: n 1.0", chat([[U]], n=1.0), BATCH),
        case("batch: n \"1\"", chat([[U]], n="1"), BATCH),
        case("batch: n 2", chat([[U]], n=2), BATCH),
        case("batch: use_beam_search \"false\"", chat([[U]], use_beam_search="false"), BATCH),
        case("batch: stream", chat([[U], [U]], 4, stream=True), BATCH),
        case("batch: tool_choice auto", chat([[U]], tool_choice="auto"), BATCH),
        case("batch: one message, not a conversation", chat([U]), BATCH),
        case("batch: an empty conversation", chat([[U], []]), BATCH),
        case("batch: a system message after a user's in a conversation",
             chat([[U], [U, {"role": "system", "content": "Be terse."}]]), BATCH),
        case("batch: no conversation", chat([]), BATCH),
        case("batch: a model not served", chat([[U]], model="nope"), BATCH),
        case("batch: continue_final_message",
             chat([[U, {"role": "assistant", "content": "The capital is"}]],
                  add_generation_prompt=False, continue_final_message=True), BATCH),
    ]


# Stop strings that end a random model's answer within a few tokens: a case whose output limit
# is the context's own runs in seconds, and counts the same.
BRAKE = ["e", "a", " ", "\n"]


def long_text(tokens):
    """A text of about `tokens` tokens (about four characters each), of the run's material."""
    words = " ".join(material.USERS + material.SYSTEMS + material.ANSWERS).split()
    out, n = [], 0
    while n < tokens * 4:
        w = words[len(out) % len(words)]
        out.append(w)
        n += len(w) + 1
    return " ".join(out)


def edge_cases():
    """The engine's edges: shapes vLLM 0.32's request models and its handling take that the
    gateway once refused or counted otherwise, each by name (docs/vllm-parity.md)."""
    system = long_text(3000)
    tools = [{"name": t["function"]["name"] if "function" in t else t["name"],
              "description": (t.get("function") or t).get("description") or "",
              "input_schema": (t.get("function") or t).get("parameters") or {"type": "object"}}
             for t in material.TOOLS]
    claude_code = {"model": MODEL, "max_tokens": 32000, "stream": True,
                   "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2"},
                              {"type": "text", "text": system}],
                   "tools": tools, "messages": [{"role": "user", "content": "Fix the failing test."}],
                   "stop_sequences": BRAKE}
    past = MAX_MODEL_LEN  # an output limit no prompt leaves room for
    args = lambda a: [U, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": a}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
    part = lambda *parts: chat([{"role": "user", "content": "Say something."},
                                {"role": "assistant", "content": list(parts)},
                                {"role": "user", "content": "Go on."}])
    raw = lambda text: text.encode()
    return [
        # An output limit past what the context leaves: vLLM 0.32 answers with the rest.
        case("a Claude Code-sized request on a 32K deployment (max_tokens 32000)", claude_code,
             MESSAGES, clamped=32000),
        case("chat: max_tokens past what the context leaves", chat(
            [{"role": "system", "content": system}, U], past, stop=BRAKE), clamped=past),
        case("chat: max_completion_tokens past what the context leaves", {
            "model": MODEL, "messages": [U], "max_completion_tokens": past, "stop": BRAKE},
             clamped=past),
        case("completions: max_tokens past what the context leaves", {
            "model": MODEL, "prompt": system, "max_tokens": past, "stop": BRAKE},
             "/v1/completions", clamped=past),
        case("responses: max_output_tokens past what the context leaves", {
            "model": MODEL, "input": system, "max_output_tokens": past, "stop": BRAKE},
             RESPONSES, clamped=past),
        case("responses: truncation auto cuts a prompt past the context", {
            "model": MODEL, "input": long_text(MAX_MODEL_LEN + 200), "max_output_tokens": 4,
            "truncation": "auto"}, RESPONSES),
        # Defaults that must not make vLLM refuse.
        case("min_tokens above the default output cap", {
            "model": MODEL, "messages": [U], "min_tokens": 100, "stop": BRAKE}),
        # Fields vLLM ignores on a route.
        case("completions: max_completion_tokens is ignored", {
            "model": MODEL, "prompt": "Once upon", "max_tokens": 3, "max_completion_tokens": 50},
             "/v1/completions", direct=True),
        case("completions: max_completion_tokens alone is ignored (16 generated)", {
            "model": MODEL, "prompt": "Once upon", "max_completion_tokens": 5},
             "/v1/completions", direct=True),
        # The types pydantic reads leniently.
        case("max_tokens as a string", chat([U], "3"), direct=True),
        case("max_tokens as a whole float", chat([U], 3.0), direct=True),
        case("n as a string", chat([U], 2, n="2")),
        case("stream as the string true", chat([U], 3, "true")),
        case("stream_options {} without a stream", chat([U], 2, stream_options={})),
        case("stream_options null without a stream", chat([U], 2, stream_options=None)),
        case("model left out", {"messages": [U], "max_tokens": 2}),
        case("model empty", {"model": "", "prompt": "Once", "max_tokens": 2}, "/v1/completions"),
        case("a UTF-8 byte order mark before the body",
             b"\xef\xbb\xbf" + json.dumps(chat([U])).encode()),
        case("NaN in a field vLLM passes over (an unknown member)", raw(
            '{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
            '"client_data": {"x": NaN}}' % MODEL)),
        case("a tool schema with NaN and Infinity", raw(
            '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], '
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": '
            '"object", "properties": {"n": {"type": "number", "maximum": Infinity, '
            '"default": NaN}}}}}]}' % MODEL)),
        case("lm-eval's prompt logprobs: echo with max_tokens 0", {
            "model": MODEL, "prompt": "The capital of France is Paris", "max_tokens": 0,
            "echo": True, "logprobs": 1, "temperature": 0}, "/v1/completions", direct=True),
        # Content parts vLLM reads as text, or skips.
        case("a refusal part in a replayed answer", part(
            {"type": "refusal", "refusal": "I cannot help with that."})),
        case("a thinking part in a replayed answer", part(
            {"type": "thinking", "thinking": "Let me think."}, {"type": "text", "text": "Fine."})),
        case("a text part with null text", part({"type": "text", "text": None},
                                                {"type": "text", "text": "Fine."})),
        case("output_text and input_text parts", chat([{"role": "user", "content": [
            {"type": "input_text", "text": "Hello"}, {"type": "output_text", "text": " there"}]}])),
        # Numbers Python's json keeps exactly, in tool-call arguments.
        case("tool-call arguments with an integer past 64 bits",
             chat(args('{"n": 123456789012345678901234567890}'), tools=[WEATHER])),
        case("tool-call arguments with -0", chat(args('{"n": -0, "m": [-0, 1]}'), tools=[WEATHER])),
        case("tool-call arguments with NaN and infinities", chat(
            args('{"n": NaN, "m": [Infinity, -Infinity, 1e400]}'), tools=[WEATHER])),
        case("a tool schema with an integer past 64 bits and -0", raw(
            '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], '
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": '
            '"object", "properties": {"n": {"type": "integer", "maximum": '
            '18446744073709551616, "minimum": -0}}}}}]}' % MODEL)),
        # An echoed prompt is not output, streamed (cut before usage) or whole.
        case("completions with echo, cut before usage", {
            "model": MODEL, "prompt": "Count: 1, 2, 3,", "max_tokens": 30, "echo": True,
            "stream": True}, "/v1/completions", cut_after=3, continuous=False),
        case("completions: echo of a long prompt with logprobs, streamed (an event past 1 MiB)", {
            "model": MODEL, "prompt": long_text(3000), "max_tokens": 2, "echo": True,
            "logprobs": 20, "stream": True, "stream_options": {"include_usage": True}},
             "/v1/completions"),
        # Usage the client declined.
        case("continuous usage without include_usage", {
            "model": MODEL, "messages": [U], "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": False, "continuous_usage_stats": True}},
             no_usage=True),
    ]


RESPONSES = "/v1/responses"


def responses_cases():
    """`/v1/responses`, which vLLM converts to a chat: each rule of the conversion
    by name."""
    u = {"role": "user", "content": "What is the capital of France?"}
    weather = {"type": "function", "name": "get_weather", "description": "Get the weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                              "required": ["city"]}}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\": \"Paris\"}"}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": [],
                 "content": [{"type": "reasoning_text", "text": " ".join(material.REASONINGS)}]}
    said = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}
    r = lambda name, body, **kw: case(f"responses: {name}", body, RESPONSES, **kw)
    base = lambda inp, n=2, **extra: {"model": MODEL, "input": inp, "max_output_tokens": n,
                                      **extra}
    return [
        r("a string", base("What is the capital of France?")),
        r("a string, streamed", base("What is the capital of France?", 4, stream=True)),
        r("instructions", base("What is the capital of France?", instructions="Be terse.")),
        r("message items with input_text parts", base([
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": [{"type": "input_text", "text": "What is the capital"},
                                         {"type": "input_text", "text": " of France?"}]}])),
        r("an earlier answer as an output message", base(
            [u, said, {"role": "user", "content": "And of Italy?"}])),
        r("an earlier answer as an assistant role item", base(
            [u, {"role": "assistant", "content": "Paris."},
             {"role": "user", "content": "And of Italy?"}])),
        r("reasoning, a function call and its output", base(
            [u, reasoning, call, output], tools=[weather])),
        r("a function call, its output and the answer", base(
            [u, call, output, said, {"role": "user", "content": "Thanks."}], tools=[weather])),
        r("tools, streamed", base([u, call, output], 4, stream=True, tools=[weather])),
        r("a built-in tool beside a function", base([u], tools=[weather, {"type": "web_search"}])),
        # vLLM 0.32 shows the model a custom tool as a function of one string, `input`.
        r("custom tools", base([u], tools=[weather, {"type": "custom", "name": "shell"},
                                           {"type": "custom", "name": "sql",
                                            "description": "Runs a query.",
                                            "format": {"type": "text"}}])),
        r("a custom tool with a grammar", base([u], tools=[{"type": "custom", "name": "g",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: \"a\""}}])),
        # A namespace's functions are shown as `<namespace>__<name>`, its custom tools not at
        # all; a call that names its namespace calls that function.
        r("namespace tools and a namespaced call", base(
            [u, {**call, "namespace": "crm"}, output],
            tools=[weather, {"type": "namespace", "name": "crm", "description": "CRM tools.",
                             "tools": [{**weather, "description": "Looks a city up."},
                                       {"type": "custom", "name": "note"}]}])),
        r("a call with an empty namespace", base([u, {**call, "namespace": ""}, output],
                                               tools=[weather])),
        r("a namespace without a description", base([u], tools=[
            {"type": "namespace", "name": "crm", "tools": [weather]}])),
        # A custom tool's call is a call of its function, its text the argument `input`.
        r("a custom tool's call and its output", base(
            [u, {"type": "custom_tool_call", "call_id": "call_2", "name": "shell",
                 "input": "ls -la \"docs\"\n\u00e9\t\u0001"},
             {"type": "custom_tool_call_output", "call_id": "call_2", "output": "README.md"}],
            tools=[{"type": "custom", "name": "shell"}])),
        r("developer item", base([{"role": "developer", "content": "Answer in French."}, u])),
        r("reasoning effort none", base([u], reasoning={"effort": "none"})),
        r("reasoning effort high", base([u], reasoning={"effort": "high"})),
        r("enable_thinking false", base([u], chat_template_kwargs={"enable_thinking": False})),
        r("an input image", base([{"role": "user", "content": [
            {"type": "input_image", "image_url": image_url(96, 64, rng=random.Random("responses")),
             "detail": "auto"},
            {"type": "input_text", "text": "What is this?"}]}])),
        r("a partial answer continued", base(
            [u, {"type": "message", "id": "msg_2", "role": "assistant", "status": "incomplete",
                 "content": [{"type": "output_text", "text": "The capital is", "annotations": []}]}])),
        r("store true", base("Hi", store=True)),
        # Not a field of vLLM's Responses model: passed over, the deployment's template renders.
        r("a request's chat_template", base("Hi", chat_template="{{ messages[0].content }}")),
        r("an empty chat_template", base("Hi", chat_template="")),
        r("previous_response_id", base("Hi", previous_response_id="resp_x")),
    ]


MESSAGES = "/v1/messages"


def messages(msgs, max_tokens=2, stream_=False, **extra):
    """An Anthropic Messages body."""
    body = {"model": MODEL, "messages": msgs, "max_tokens": max_tokens, "stream": stream_}
    body.update(extra)
    return body


def anthropic_image(width, height, fmt="PNG"):
    # Pixels of its own (a seed no other case uses): vLLM 0.32's /v1/messages answers 500 when
    # its multimodal cache drifts on an image an earlier request sent (docs/vllm-parity.md).
    url = image_url(width, height, fmt, random.Random(f"messages {width}x{height}"))
    media_type, _, data = url.removeprefix("data:").partition(";base64,")
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def messages_cases():
    """`/v1/messages`, which vLLM converts to a chat before its template renders it:
    each conversion rule by name."""
    u = {"role": "user", "content": "What is the capital of France?"}
    weather = {"name": "get_weather", "description": "Get the weather for a city.",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}
    call = {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}
    result = {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1",
         "content": [{"type": "text", "text": "Sunny"}, {"type": "text", "text": "21 C"}]}]}
    thought = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": " ".join(material.REASONINGS), "signature": "sig"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Paris."}]}
    m = lambda name, body: case(f"messages: {name}", body, MESSAGES)
    return [
        m("plain", messages([u])),
        m("plain, streamed", messages([u], 4, True)),
        # vLLM 0.32 renders it as "Tool result: " and Python's str() of its content.
        m("tool results in an assistant turn", messages(
            [u, {"role": "assistant", "content": [
                {"type": "text", "text": "Noted."},
                {"type": "tool_result", "tool_use_id": "t", "content": [
                    {"type": "text", "text": "ok", "n": 1.5, "b": True, "z": None}]},
                {"type": "tool_result", "tool_use_id": "u", "content": "plain"},
                {"type": "tool_result", "tool_use_id": "v"}]},
             {"role": "user", "content": "Go on."}])),
        m("system string", messages([u], system="You are terse.")),
        m("system blocks with Claude Code's billing header",
          messages([u], system=[{"type": "text", "text": "x-anthropic-billing-header: cc=1"},
                                {"type": "text", "text": "You are terse."},
                                {"type": "text", "text": " Answer in French."}])),
        m("a system message mid-conversation", messages(
            [u, {"role": "assistant", "content": "Paris."},
             {"role": "system", "content": "Now answer in French."},
             {"role": "user", "content": "And of Italy?"}], system="Be brief.")),
        m("text blocks, one empty", messages([{"role": "user", "content": [
            {"type": "text", "text": "What is the capital"}, {"type": "text", "text": ""},
            {"type": "text", "text": " of France?"}]}])),
        m("tools, a tool use and its result", messages([u, call, result], tools=[weather])),
        m("tools, streamed", messages([u, call, result], 4, True, tools=[weather])),
        m("tool without description or schema type", messages([u], tools=[
            {"name": "ping", "input_schema": {"properties": {}}}])),
        m("tool_use without input", messages([u, {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_2", "name": "ping"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2"}]}],
            tools=[{"name": "ping", "input_schema": {"type": "object"}}])),
        m("tool_result with text then a user text", messages([u, call, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"},
            {"type": "text", "text": "Thanks. And tomorrow?"}]}], tools=[weather])),
        m("tool_result with an image", messages([u, call, {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "A map:"}, anthropic_image(64, 48)]}]}],
            tools=[weather])),
        m("image block", messages([{"role": "user", "content": [
            anthropic_image(120, 80), {"type": "text", "text": "What is this?"}]}])),
        m("thinking and redacted thinking in history", messages(
            [u, thought, {"role": "user", "content": "And of Italy?"}])),
        m("thinking disabled", messages([u], thinking={"type": "disabled"})),
        m("thinking enabled with a budget", messages([u], 1100, thinking={
            "type": "enabled", "budget_tokens": 1024})),
        m("output_config effort", messages([u], output_config={"effort": "low"})),
        m("chat_template_kwargs enable_thinking false",
          messages([u], chat_template_kwargs={"enable_thinking": False})),
        m("stop_sequences, temperature, metadata", messages(
            [u], stop_sequences=["\n\n"], temperature=0.5, top_k=5, metadata={"user_id": "u1"})),
        m("without max_tokens", {"model": MODEL, "messages": [u]}),
    ]


KINDS = ["chat", "chat", "chat", "chat_stream", "cut", "completion", "image", "messages",
         "responses"]


def random_text(rng):
    pool = material.USERS + material.SYSTEMS + material.ANSWERS
    text = rng.choice(pool)
    if rng.random() < 0.2:
        text = text + " " + rng.choice(pool)
    if rng.random() < 0.1:
        text = "  " + text + "\n\n"
    return text


def random_messages(rng, images):
    messages = []
    tools = None
    if rng.random() < 0.3:
        tools = [t if "function" in t else {"type": "function", "function": t}
                 for t in rng.sample(material.TOOLS, rng.randint(1, 3))]
    if rng.random() < 0.5:
        role = rng.choice(["system", "system", "developer"])
        messages.append({"role": role, "content": rng.choice(material.SYSTEMS)})
    for turn in range(rng.choice([1, 1, 2, 3])):
        content = random_text(rng)
        if images and turn == 0:
            parts = [image_part(rng.randint(8, 400), rng.randint(8, 400),
                                rng.choice(["PNG", "JPEG"]), rng)
                     for _ in range(rng.choice([1, 1, 2]))]
            content = parts + [{"type": "text", "text": content}]
        messages.append({"role": "user", "content": content})
        if rng.random() < 0.5:
            a = {"role": "assistant", "content": rng.choice(material.ANSWERS)}
            if rng.random() < 0.3:
                a[rng.choice(["reasoning", "reasoning_content"])] = rng.choice(material.REASONINGS)
            messages.append(a)
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": random_text(rng)})
    return messages, tools


def as_messages_body(rng, chat_messages, tools):
    """A random chat as an Anthropic Messages body: its first system (or developer) text as
    `system`, a reasoning turn's reasoning as a thinking block, text as a string or as blocks."""
    body = {"model": MODEL, "max_tokens": rng.randint(1, 4), "messages": []}
    for m in chat_messages:
        if m["role"] in ("system", "developer"):
            body["system"] = m["content"]
            continue
        reasoning = m.get("reasoning") or m.get("reasoning_content")
        if reasoning or rng.random() < 0.3:
            blocks = [{"type": "text", "text": m["content"]}]
            if reasoning:
                blocks.insert(0, {"type": "thinking", "thinking": reasoning, "signature": "s"})
            body["messages"].append({"role": m["role"], "content": blocks})
        else:
            body["messages"].append({"role": m["role"], "content": m["content"]})
    if tools:
        body["tools"] = [{"name": t["function"]["name"],
                          "description": t["function"].get("description"),
                          "input_schema": t["function"].get("parameters") or {"type": "object"}}
                         for t in tools]
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.25:
        body["thinking"] = {"type": rng.choice(["disabled", "adaptive"])}
    return body


def as_responses_body(rng, chat_messages, tools):
    """A random chat as a Responses body: a first system text as `instructions` or as an item,
    text as a string or as `input_text` parts, an earlier answer as an output message or a role
    item, its reasoning as a reasoning item before it."""
    body = {"model": MODEL, "max_output_tokens": rng.randint(1, 4), "input": []}
    for m in chat_messages:
        reasoning = m.get("reasoning") or m.get("reasoning_content")
        if m["role"] in ("system", "developer") and "instructions" not in body \
                and rng.random() < 0.5:
            body["instructions"] = m["content"]
        elif m["role"] == "assistant":
            if reasoning:
                body["input"].append({"type": "reasoning", "id": "rs_0", "summary": [],
                                      "content": [{"type": "reasoning_text", "text": reasoning}]})
            if rng.random() < 0.5:
                body["input"].append({"type": "message", "id": "msg_0", "role": "assistant",
                                      "status": "completed", "content": [
                                          {"type": "output_text", "text": m["content"],
                                           "annotations": []}]})
            else:
                body["input"].append({"role": "assistant", "content": m["content"]})
        elif rng.random() < 0.3:
            body["input"].append({"role": m["role"], "content": [
                {"type": "input_text", "text": m["content"]}]})
        else:
            body["input"].append({"role": m["role"], "content": m["content"]})
    if tools:
        body["tools"] = [{"type": "function", **t["function"]} for t in tools]
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.25:
        body["reasoning"] = {"effort": rng.choice(["none", "low", "high"])}
    return body


def pooling_cases():
    """The pooling routes, for `--pooling`: each input form vLLM's pooling runner
    takes on each route, and the options that change what it counts."""
    q = "What is the capital of France?"
    docs = ["Paris is the capital of France.", "Berlin", "The Eiffel Tower is in Paris."]
    conv = [{"role": "system", "content": "Be terse."}, U, A, {"role": "user", "content": "Why?"}]
    p = lambda name, path, body: case(f"pooling {path}: {name}", {"model": MODEL, **body}, path)
    out = [
        p("a text", EMBEDDINGS, {"input": q}),
        p("texts", EMBEDDINGS, {"input": [q, "hello world", "  spaced\n\n"]}),
        p("token ids", EMBEDDINGS, {"input": [9707, 1879, 248046]}),
        p("lists of token ids", EMBEDDINGS, {"input": [[9707, 1879], [1, 2, 3]]}),
        p("a conversation as messages", EMBEDDINGS, {"messages": [U]}),
        p("a longer conversation", EMBEDDINGS, {"messages": conv}),
        p("a conversation as input", EMBEDDINGS, {"input": conv}),
        p("truncated", EMBEDDINGS, {"input": [q, "hello"], "truncate_prompt_tokens": 3}),
        p("truncated to the context", EMBEDDINGS, {"input": q, "truncate_prompt_tokens": -1}),
        p("base64", EMBEDDINGS, {"input": q, "encoding_format": "base64"}),
        p("dimensions on a model without them", EMBEDDINGS, {"input": q, "dimensions": 4}),
        p("an unknown model", EMBEDDINGS, {"input": q, "model": "nope"}),
        p("a text", POOLING, {"input": q}),
        p("a conversation", POOLING, {"messages": conv}),
        p("token ids", POOLING, {"input": [[9707, 1879]]}),
        # Both: vLLM runs the conversation and ignores the input, or, when the messages are
        # not a conversation, runs the input.
        p("input and messages", EMBEDDINGS, {"input": q, "messages": [U]}),
        p("input and messages that are not a conversation", EMBEDDINGS,
          {"input": q, "messages": "hello"}),
        p("conversations as input", EMBEDDINGS, {"input": [[U], conv]}),
        p("conversations as messages", EMBEDDINGS, {"messages": [[U], conv]}),
        # Refused, by vLLM as by the gateway.
        p("an empty text", EMBEDDINGS, {"input": ""}),
        p("no input", EMBEDDINGS, {}),
        p("past the context", EMBEDDINGS, {"input": "hello " * (MAX_MODEL_LEN + 10)}),
        p("truncated past the context", EMBEDDINGS, {"input": q,
                                                     "truncate_prompt_tokens": MAX_MODEL_LEN + 1}),
        p("queries and documents of unequal counts", "/score", {"queries": [q, "a", "b"],
                                                                "documents": docs[:2]}),
        p("two queries", "/rerank", {"query": [q, "a"], "documents": docs}),
        p("truncated to nothing", EMBEDDINGS, {"input": q, "truncate_prompt_tokens": 0}),
        # A document whose first two tokens are parts of one character is cut to nothing.
        p("a document cut to nothing", "/rerank", {"query": q, "documents": [
            "\U0001f469\u200d\U0001f469\u200d\U0001f467 family"], "max_tokens_per_doc": 2}),
        p("max_tokens_per_doc of -1", "/score", {"queries": q, "documents": docs,
                                                 "max_tokens_per_doc": -1}),
        p("max_tokens_per_query null", "/rerank", {"query": q, "documents": docs,
                                                   "max_tokens_per_query": None}),
        # More prompts than the pooling backend's batch of 64: run in turns, as vLLM runs
        # them, and counted whole.
        p("100 texts, more than a batch", EMBEDDINGS,
          {"input": [f"{q} {i}" for i in range(100)]}),
        p("80 documents, more than a batch", "/rerank",
          {"query": q, "documents": [f"{docs[i % 3]} {i}" for i in range(80)]}),
        p("70 texts, more than a batch", "/v2/embed",
          {"texts": [f"text {i}" for i in range(70)], "embedding_types": ["float"]}),
        # Served as vLLM serves them.
        case("pooling /v1/embeddings: model left out", {"input": q}, EMBEDDINGS),
        p("model empty", POOLING, {"input": q, "model": ""}),
        p("truncated, as a whole float", EMBEDDINGS, {"input": [q, "hello"],
                                                     "truncate_prompt_tokens": 3.0}),
        p("a conversation with tools and documents", EMBEDDINGS, {
            "messages": conv, "documents": [{"title": "t", "text": "Paris."}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
        # vLLM's chat forms refuse these fields, and the body is read by its input.
        p("a conversation with continue_final_message null, beside an input", EMBEDDINGS, {
            "messages": conv, "input": q, "continue_final_message": None}),
        p("a conversation with a chat_template of 5, beside an input", POOLING, {
            "messages": conv, "input": q, "chat_template": 5}),
        p("a conversation with a list as enable_thinking", POOLING, {
            "messages": conv, "chat_template_kwargs": {"enable_thinking": [1]}}),
        # Refused by the gateway alone (KNOWN).
        p("padded", EMBEDDINGS, {"input": [q, "a"], "padding": "max_length"}),
        p("a multimodal document", "/score", {"queries": q, "documents": [
            {"content": [{"type": "text", "text": "Paris"}]}]}),
    ]
    for path in ("/score", "/v1/score"):
        out += [
            p("one text against one", path, {"text_1": q, "text_2": docs[0]}),
            p("one query against documents", path, {"queries": q, "documents": docs}),
            p("queries against as many documents", path, {"queries": [q, "hello"],
                                                           "documents": docs[:2]}),
            p("data_1 and data_2", path, {"data_1": q, "data_2": docs}),
            p("queries and items", path, {"queries": q, "items": docs[1:]}),
            p("truncated", path, {"queries": q, "documents": docs, "truncate_prompt_tokens": 4}),
            # vLLM's union of the four forms runs the first whose inputs pydantic reads.
            p("documents pydantic refuses, and items", path, {"queries": q, "documents": [5],
                                                             "items": docs[1:]}),
            # Each text cut first, as vLLM's truncate_text_to_tokens cuts it: whole words, a
            # CJK text, a character two tokens share (the emoji goes whole).
            p("texts cut by max_tokens_per_query and max_tokens_per_doc", path, {
                "queries": q, "documents": docs + ["東京から大阪まで新幹線で何分かかりますか？",
                                                   "emoji test \U0001f680\U0001f525 count"],
                "max_tokens_per_query": 3, "max_tokens_per_doc": "5"}),
        ]
    parts = {"content": [{"type": "text", "text": q}, {"type": "text", "text": "hello"}]}
    out += [
        p("texts", COHERE, {"texts": [q, "hello world", "  spaced\n\n"]}),
        p("inputs of text parts", COHERE, {"inputs": [parts, {"content": []}]}),
        p("cut at the end", COHERE, {"texts": [q, "hi"], "max_tokens": 3}),
        p("cut at the start", COHERE, {"texts": [q], "truncate": "START", "max_tokens": 3}),
        p("inputs cut", COHERE, {"inputs": [parts], "truncate": "END", "max_tokens": 4}),
        p("max_tokens of -1", COHERE, {"texts": [q], "max_tokens": -1}),
        p("max_tokens as a string", COHERE, {"texts": [q], "max_tokens": "3"}),
        p("not cut, within max_tokens", COHERE, {"texts": [q], "truncate": "NONE",
                                                  "max_tokens": 100}),
        p("not cut, max_tokens past the context", COHERE, {
            "texts": [q], "truncate": "NONE", "max_tokens": MAX_MODEL_LEN + 1}),
        p("every embedding type", COHERE, {"texts": [q], "embedding_types": [
            "float", "binary", "ubinary", "base64"]}),
        p("input_type null, and a field Cohere does not have", COHERE, {
            "texts": [q], "input_type": None, "padding": "max_length"}),
        case("pooling /v2/embed: model left out", {"texts": [q]}, COHERE),
        # Refused, by vLLM as by the gateway (the gateway before anything runs).
        p("not cut, past max_tokens", COHERE, {"texts": ["hi", q], "truncate": "NONE",
                                                "max_tokens": 3}),
        p("not cut, max_tokens below 0", COHERE, {"texts": ["hi"], "truncate": "NONE",
                                                   "max_tokens": -2}),
        p("an input_type", COHERE, {"texts": [q], "input_type": "search_query"}),
        p("texts and inputs", COHERE, {"texts": [q], "inputs": [parts]}),
        p("no texts", COHERE, {"texts": []}),
        p("nothing to embed", COHERE, {"images": None}),
        p("a text that is a number", COHERE, {"texts": [5]}),
        p("an empty text", COHERE, {"texts": [""]}),
        p("max_tokens of 0", COHERE, {"texts": [q], "max_tokens": 0}),
        p("max_tokens below -1", COHERE, {"texts": [q], "max_tokens": -2}),
        p("max_tokens past the context", COHERE, {"texts": [q], "max_tokens": MAX_MODEL_LEN + 1}),
        p("truncate in lower case", COHERE, {"texts": [q], "truncate": "end"}),
        p("a text part without its text", COHERE, {"inputs": [{"content": [{"type": "text"}]}]}),
        p("an embedding type Cohere does not have", COHERE, {"texts": [q],
                                                              "embedding_types": ["half"]}),
        p("output_dimension on a model without it", COHERE, {"texts": [q],
                                                              "output_dimension": 8}),
        p("past the context, not cut", COHERE, {"texts": ["hello " * (MAX_MODEL_LEN + 10)],
                                                "truncate": "NONE"}),
        p("an unknown model", COHERE, {"texts": [q], "model": "nope"}),
    ]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        out += [
            p("documents", path, {"query": q, "documents": docs}),
            p("top_n", path, {"query": q, "documents": docs, "top_n": 2}),
            p("without documents returned", path, {"query": q, "documents": docs,
                                                   "return_documents": False}),
            p("texts cut by max_tokens_per_doc", path, {
                "query": q, "documents": docs + ["e\u0301cole cafe\u0301 \u00c5 and more"],
                "max_tokens_per_doc": 2, "max_tokens_per_query": True}),
        ]
    return out


def generated_pooling_cases(n, seed):
    """`n` pooling requests of random texts and conversations over the routes."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choice(["embed", "embed", "chat", "score", "rerank"])
        texts = [random_text(rng) for _ in range(rng.randint(1, 4))]
        if kind == "embed":
            body = {"input": texts if len(texts) > 1 else texts[0]}
            path = rng.choice([EMBEDDINGS, POOLING])
        elif kind == "chat":
            body = {"messages": random_messages(rng, False)[0]}
            path = rng.choice([EMBEDDINGS, POOLING])
        elif kind == "score":
            body = {"queries": texts[0], "documents": texts[1:] or [random_text(rng)]}
            path = rng.choice(["/score", "/v1/score"])
        else:
            body = {"query": texts[0], "documents": texts[1:] or [random_text(rng)]}
            path = rng.choice(["/rerank", "/v1/rerank", "/v2/rerank"])
        if rng.random() < 0.15:
            body["truncate_prompt_tokens"] = rng.randint(1, 12)
        out.append(case(f"generated {i}: pooling {path}", {"model": MODEL, **body}, path))
    return out


EMBEDDINGS = "/v1/embeddings"
POOLING = "/pooling"
COHERE = "/v2/embed"


def generated_cases(n, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.choice(KINDS)
        if kind == "completion":
            body = {"model": MODEL, "prompt": random_text(rng), "max_tokens": rng.randint(1, 4)}
            if rng.random() < 0.3:
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
            if rng.random() < 0.1:
                body["n"] = rng.randint(2, 3)
            if rng.random() < 0.1:
                body["prompt"] = [body["prompt"]] + [random_text(rng) for _ in range(rng.randint(1, 3))]
            out.append(case(f"generated {i}: completion", body, "/v1/completions"))
            continue
        if kind == "responses":
            body = as_responses_body(rng, *random_messages(rng, False))
            out.append(case(f"generated {i}: responses", body, RESPONSES))
            continue
        if kind == "messages":
            body = as_messages_body(rng, *random_messages(rng, False))
            out.append(case(f"generated {i}: messages", body, MESSAGES))
            continue
        messages, tools = random_messages(rng, kind == "image")
        extra = {}
        if tools:
            extra["tools"] = tools
        if rng.random() < 0.25:
            extra["chat_template_kwargs"] = {"enable_thinking": rng.choice([True, False])}
        streamed = kind in ("chat_stream", "cut")
        if kind != "cut" and rng.random() < 0.1:
            extra["n"] = rng.randint(2, 3)
        body = chat(messages, rng.randint(1, 4) if kind != "cut" else 30, streamed, **extra)
        out.append(case(f"generated {i}: {kind}", body,
                        cut_after=rng.randint(1, 12) if kind == "cut" else None,
                        # Greedy references are the named cases': a generated cut asks for
                        # continuous usage, which needs no second run.
                        continuous=True))
    return out


# Output tokens a cut stream may be charged past the last chunk its client read: chunks the
# gateway had already written to the client's socket when it closed.
CUT_SLACK = 2

REFUSED = "gateway 400 ({}), vLLM 200"

# Differences kept on purpose (docs/vllm-parity.md): name -> (the start of the difference
# expected, why). A known difference that changes, or goes away, fails the suite.
KNOWN = {
    "chat_template_kwargs tools": (
        "gateway 400", "template arguments the template renders are refused, but its switches"),
    "truncate_prompt_tokens cutting a prompt with an image": (
        "gateway 400", "where a cut falls among images is the engine's (vLLM refuses a split image)"),
    "truncate_prompt_tokens cutting an echoed prompt": (
        "gateway 400", "the answer would repeat the cut prompt, which the gateway does not know"),
    "use_beam_search": ("gateway 400", "a beam search decodes several sequences"),
    "body priority": ("gateway 400", "a negative priority would lift a request above its class"),
    "batch: stream": (
        "gateway 400", "vLLM answers a streamed batch with each conversation's last piece only"),
    "vllm_xargs": ("gateway 400", "the engine's extension arguments are the deployment's to set"),
    "pooling /v1/embeddings: padded": (
        "gateway 400", "each text would run padded to the whole context"),
    "pooling /score: a multimodal document": (
        "gateway 400", "the gateway does not count a pooling backend's multimodal inputs"),
}


# ---------------------------------------------------------------------------------------------
# Running.


def answer_usage(answer):
    """An answer's usage, in OpenAI's terms: its `usage`, or a Cohere embed answer's billed
    input and image tokens."""
    billed = (answer.get("meta") or {}).get("billed_units")
    if "usage" not in answer and billed is not None:
        return {"prompt_tokens": (billed.get("input_tokens") or 0)
                + (billed.get("image_tokens") or 0), "completion_tokens": 0}
    return as_openai_usage(answer.get("usage"))


def vllm_usage(c, status, events_or_body):
    """vLLM's usage as the client received it, or None."""
    if status != 200:
        return None
    if isinstance(events_or_body, list):
        usages = [e["usage"] for e in events_or_body if isinstance(e, dict) and e.get("usage")]
        usages += [e["response"]["usage"] for e in events_or_body if isinstance(e, dict)
                   and isinstance(e.get("response"), dict) and e["response"].get("usage")]
        return as_openai_usage(usages[-1]) if usages else None
    return answer_usage(json.loads(events_or_body))


def run_case(c, gw_host, gw_port, vllm_url, index):
    rid = f"parity-{index}"
    # Anthropic's clients send their key as x-api-key.
    auth = {"x-api-key": KEY} if c["path"] == MESSAGES else {"authorization": f"Bearer {KEY}"}
    headers = {**auth, "x-request-id": rid}
    body = c["body"]
    result = {"case": c, "rid": rid}
    if not isinstance(body, bytes) and body.get("stream"):
        status, events, cut = stream(gw_host, gw_port, c["path"], body, headers, c["cut_after"])
        if status != 200:
            result.update(status=status, cut=False, error=events)
        else:
            result.update(status=status, cut=cut,
                          delivered=[e for e in events if isinstance(e, dict) and delivers(e)],
                          client_usage=any(isinstance(e, dict) and e.get("usage")
                                           for e in events))
            result["usage"] = vllm_usage(c, status, events)
            if cut and not c["continuous"]:
                ref = dict(body)
                ref["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
                host, _, port = vllm_url.removeprefix("http://").partition(":")
                _, ref_events, _ = stream(host, int(port), c["path"], ref, {}, c["cut_after"])
                result["reference"] = [e for e in ref_events
                                       if isinstance(e, dict) and e.get("choices")]
    else:
        status, _, raw = post(f"http://{gw_host}:{gw_port}{c['path']}", body, headers)
        result.update(status=status, cut=False)
        result["usage"] = vllm_usage(c, status, raw)
        if status != 200:
            result["error"] = raw.decode(errors="replace")[:400]
    if status != 200 or c["direct"]:
        # Refused by the gateway (does vLLM serve it?), or to be compared with vLLM's own run.
        direct = body
        if not isinstance(body, bytes):
            direct = dict(body)
            direct["stream"] = False
            direct.pop("stream_options", None)
        d_status, _, d_raw = post(f"{vllm_url}{c['path']}", direct)
        result["vllm_status"] = d_status
        result["vllm_usage"] = answer_usage(json.loads(d_raw)) if d_status == 200 else None
    return result


def read_log(path, rids, seconds=30):
    """The usage log's lines for these request ids, waiting for all of them (bounded)."""
    deadline = time.monotonic() + seconds
    while True:
        lines = {}
        if path.exists():
            for line in path.read_text().splitlines():
                rec = json.loads(line)
                lines[rec.get("request_id")] = rec
        missing = [r for r in rids if r not in lines]
        if not missing or time.monotonic() > deadline:
            return lines, missing
        time.sleep(0.2)


def delta_text(chunks):
    """What a stream's chunks said, content, reasoning and tool calls."""
    out = []
    for e in chunks:
        for ch in e["choices"]:
            d = ch.get("delta") or {}
            out.append(json.dumps([ch.get("text"), d.get("content"), d.get("reasoning"),
                                   d.get("tool_calls")]))
    return out


def judge(r, line):
    """None when the gateway's line agrees with vLLM, else what differs."""
    c = r["case"]
    if r["status"] != 200:
        if r.get("vllm_status") == 200:
            return f"gateway {r['status']} ({r.get('error')}), vLLM 200 usage {r['vllm_usage']}"
        return None
    if line is None:
        return "no usage-log line"
    counted = line.get("counted_prompt_tokens", line.get("prompt_tokens"))
    if r["cut"]:
        # What was delivered: the client cut the stream, so vLLM's count of what it had
        # generated until then is the usage of the last chunk the client received (the cut
        # cases ask for continuous usage).
        chunks = r["delivered"]
        if not c["continuous"]:
            if delta_text(r["reference"]) != delta_text(chunks):
                return "a greedy stream differed between the gateway and vLLM directly"
            chunks = r["reference"]
        usages = [e["usage"] for e in chunks if e.get("usage")]
        if not usages:
            return "a cut stream's chunks carried no usage"
        delivered = usages[-1]["completion_tokens"]
        out = line.get("output_tokens")
        if counted != usages[-1]["prompt_tokens"]:
            return f"cut stream's prompt: gateway {counted}, vLLM {usages[-1]['prompt_tokens']}"
        # The gateway charges what it handed to the client's socket; a client that closes after
        # reading k chunks may leave a chunk or two already written to it unread.
        if not delivered <= out <= delivered + CUT_SLACK:
            return f"cut after {len(r['delivered'])} events: output_tokens {out}, vLLM had generated {delivered}"
        return None
    u = r["usage"]
    if c["no_usage"]:
        if r.get("client_usage"):
            return "a chunk carried usage to a client that declined it"
        u = r["vllm_usage"]
    if u is None:
        return "vLLM's answer carried no usage"
    diffs = []
    if c["clamped"] is not None:
        allowed = min(c["clamped"], MAX_MODEL_LEN - counted)
        if line.get("reserved_output_tokens") != allowed:
            diffs.append(f"reserved {line.get('reserved_output_tokens')} output tokens, vLLM "
                         f"allows {allowed}")
    if c["direct"] and line.get("output_tokens") != r["vllm_usage"]["completion_tokens"]:
        diffs.append(f"output: gateway {line.get('output_tokens')}, vLLM on its own "
                     f"{r['vllm_usage']['completion_tokens']}")
    if counted != u["prompt_tokens"]:
        diffs.append(f"prompt: gateway {counted}, vLLM {u['prompt_tokens']}")
    if line.get("output_tokens") != u["completion_tokens"]:
        diffs.append(f"output: gateway {line.get('output_tokens')}, vLLM {u['completion_tokens']}")
    return "; ".join(diffs) or None


def admin_json(admin_port, path):
    return json.loads(harness.get(f"http://127.0.0.1:{admin_port}{path}"))


def prefill_available(admin_port, tenant):
    for t in admin_json(admin_port, "/admin/tenants")["tenants"]:
        if t["name"] == tenant:
            return t["buckets"]["prefill"]["available"]
    raise KeyError(tenant)


# A tenant whose prefill bucket refills at a thousandth of a token a second: its level after a
# request is what the request was charged, to the thousandth.
STILL_TENANT = """
[[tenants]]
name = "still"
api_keys = ["sk-still"]
prefill_tokens_per_second = 0.001
decode_tokens_per_second = 100000
requests_per_second = 1000
burst_seconds = 100000000
"""


def cached_prefill(port, admin_port, log):
    """A long prompt sent twice: vLLM's prefix cache holds most of it the second time, and the
    second request is charged its uncached tokens and a tenth of each cached one."""
    # A prefix of this run's own, so the first request finds nothing cached.
    prompt = f"Run {random.randrange(10**12)}. " + " ".join(material.USERS * 6)
    body = chat([{"role": "user", "content": prompt}], 1)
    headers = {"authorization": "Bearer sk-still"}
    levels, usages = [prefill_available(admin_port, "still")], []
    for i in range(2):
        status, _, raw = post(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                              headers | {"x-request-id": f"cached-{i}"})
        if status != 200:
            return [f"cached prefill: status {status}: {raw[:300]!r}"]
        usages.append(json.loads(raw)["usage"])
        lines, _ = read_log(log, [f"cached-{i}"])
        levels.append(prefill_available(admin_port, "still"))
    second = usages[1]
    held = [(u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in usages]
    cached = held[1]
    out = []
    if cached == 0:
        # The toy hybrid model gets no prefix-cache hits on vLLM's CPU backend: both requests
        # must then be charged whole (the weight itself is tested against the fake backend).
        print(f"parity: vLLM cached nothing of a {second['prompt_tokens']}-token prompt sent twice")
    # Charged: the whole first prompt; of the second, the uncached tokens and ceil(0.1 x cached).
    want = [u["prompt_tokens"] - c + -(-c // 10) for u, c in zip(usages, held)]
    got = [round(levels[0] - levels[1], 2), round(levels[1] - levels[2], 2)]
    if [abs(g - w) < 0.05 for g, w in zip(got, want)] != [True, True]:
        out.append(f"cached prefill: charged {got}, want {want} ({cached} cached)")
    line = read_log(log, ["cached-1"])[0].get("cached-1") or {}
    if line.get("cached_prompt_tokens") != cached:
        out.append(f"cached prefill: usage log cached_prompt_tokens {line.get('cached_prompt_tokens')}, vLLM {cached}")
    return out


def local_answers(port, vllm_url, seed):
    """`/tokenize`, `/detokenize` and `/v1/messages/count_tokens`, which the gateway answers
    itself: each equal to vLLM's own answer to the same body (status and fields), for text, chats
    and id lists that cover the special tokens, bytes that are not whole characters, and ids past
    the vocabulary, and every conversation of the Messages cases."""
    rng = random.Random(seed)
    headers = {"authorization": f"Bearer {KEY}"}
    bodies = [("/tokenize", {"model": MODEL, "prompt": random_text(rng)}) for _ in range(20)]
    bodies += [("/tokenize", {"model": MODEL, "messages": random_messages(rng, False)[0]})
               for _ in range(20)]
    # Ids from anywhere in the vocabulary: single bytes of multi-byte characters among them.
    specials = [248044, 248045, 248046, 248053, 248068]
    lists = [[rng.randrange(248044) for _ in range(rng.randint(1, 40))] for _ in range(30)]
    lists += [rng.sample(specials, 3) + [9707, 1879], [], [0], [248076], [248300], [300000]]
    bodies += [("/detokenize", {"model": MODEL, "tokens": ids}) for ids in lists]
    for c in messages_cases():
        body = {k: v for k, v in c["body"].items()
                if k in ("model", "messages", "system", "tools", "thinking", "output_config",
                         "chat_template_kwargs")}
        bodies.append((MESSAGES + "/count_tokens", body))
    # The edges: an empty prompt, the tokens spelled, numbers Python's json keeps exactly.
    odd = '{"n": 123456789012345678901234567890, "z": -0, "f": NaN, "i": [Infinity, 1e400]}'
    bodies += [
        ("/tokenize", {"model": MODEL, "prompt": ""}),
        ("/tokenize", {"model": MODEL, "prompt": "Hello world<|im_end|> é", "return_token_strs": True}),
        ("/tokenize", {"model": MODEL, "messages": [U], "return_token_strs": True}),
        ("/tokenize", {"messages": [U, {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": odd}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}]}),
        (MESSAGES + "/count_tokens", (
            '{"model": "%s", "messages": [{"role": "user", "content": "Hi"}, {"role": '
            '"assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": %s}]}, '
            '{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", '
            '"content": "ok"}]}]}' % (MODEL, odd)).encode()),
        # A thinking budget past 64 bits, which Python's json keeps as an integer.
        (MESSAGES + "/count_tokens", (
            '{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "thinking": '
            '{"type": "enabled", "budget_tokens": 1000000000000000000000000000000}}'
            % MODEL).encode()),
        # vLLM tests the pair as sent, before pydantic reads "no" as false.
        ("/tokenize", {"model": MODEL, "messages": [U], "add_generation_prompt": "no",
                       "continue_final_message": "on"}),
        ("/tokenize", {"model": MODEL, "messages": [U, {"role": "assistant", "content": "Hi"}],
                       "add_generation_prompt": 0, "continue_final_message": "yes"}),
    ]
    fields_of = {"/tokenize": ["count", "max_model_len", "tokens", "token_strs"],
                 "/detokenize": ["prompt"],
                 MESSAGES + "/count_tokens": ["input_tokens", "context_management"]}
    out = []
    for path, body in bodies:
        got = post(f"http://127.0.0.1:{port}{path}", body, headers)
        want = post(f"{vllm_url}{path}", body)
        fields = fields_of[path]
        def seen(status, raw):
            doc = json.loads(raw) if raw.startswith(b"{") else {}
            return status, {f: doc.get(f) for f in fields} if status == 200 else None
        if seen(got[0], got[2]) != seen(want[0], want[2]):
            shown = body.decode() if isinstance(body, bytes) else json.dumps(body)
            out.append(f"{path} {shown[:200]}: gateway {got[0]} {got[2][:200]!r}, "
                       f"vLLM {want[0]} {want[2][:200]!r}")
    return out


def reconciliation(a, work):
    """A gateway whose chat template renders a word more than vLLM's (as after a template
    change on the backend): vLLM's count settles each charge, and the difference is exported."""
    template = (ROOT / "assets" / "qwen3.5" / "chat_template.jinja").read_text()
    changed = work / "changed_template.jinja"
    changed.write_text("{{- 'Changed: ' -}}\n" + template)
    port, admin_port = harness.free_port(), harness.free_port()
    log = work / "usage-reconciled.jsonl"
    config = gateway_config(a.vllm_url, port, admin_port, log).replace(
        "[model]", f"chat_template = {json.dumps(str(changed))}\n[model]", 1)
    (work / "reconciled.toml").write_text(config + STILL_TENANT)
    procs = harness.Procs()
    try:
        gw = procs.start([a.gateway, "serve", "--config", str(work / "reconciled.toml")],
                         open(work / "reconciled.log", "w"))
        harness.wait_http(f"http://127.0.0.1:{admin_port}/readyz", 30, gw)
        before = prefill_available(admin_port, "still")
        status, _, raw = post(f"http://127.0.0.1:{port}/v1/chat/completions", chat([U], 1),
                              {"authorization": "Bearer sk-still", "x-request-id": "reconciled"})
        if status != 200:
            return [f"reconciliation: status {status}: {raw[:300]!r}"]
        vllm_prompt = json.loads(raw)["usage"]["prompt_tokens"]
        line = read_log(log, ["reconciled"])[0].get("reconciled") or {}
        charged = round(before - prefill_available(admin_port, "still"), 2)
        metrics = harness.get(f"http://127.0.0.1:{admin_port}/metrics")
    finally:
        procs.stop_all()
    out = []
    counted = line.get("counted_prompt_tokens")
    if counted is None or counted <= vllm_prompt:
        out.append(f"reconciliation: the changed template should count more: counted {counted}, vLLM {vllm_prompt}")
    if line.get("prompt_tokens") != vllm_prompt or abs(charged - vllm_prompt) >= 0.05:
        out.append(f"reconciliation: billed {line.get('prompt_tokens')} and charged {charged}, vLLM counted {vllm_prompt}")
    errors = [(labels, v) for n, labels, v in harness.prom_samples(metrics)
              if n == "tokengate_count_error_tokens_sum" and labels.get("kind") == "prompt"]
    if counted is not None and [v for _, v in errors] != [float(vllm_prompt - counted)]:
        out.append(f"reconciliation: count error exported {errors}, want {vllm_prompt - counted}")
    return out


def gateway_config(vllm_url, port, admin_port, log, generator=None):
    """The gateway in front of `vllm_url`; with `generator` (a URL), vLLM is declared the
    pooling backend and `generator` the generating one."""
    tokenizer = ROOT / "assets" / "qwen3.5" / "tokenizer.json"
    backend = f"""[[backends]]
url = "{vllm_url}"
vllm_version = "{VLLM_VERSION}"
kv_capacity_bytes = 1000000000000
max_batch = 64
first_byte_timeout = "120s"
"""
    if generator is not None:
        backend = f"""[[backends]]
url = "{generator}"
kv_capacity_bytes = 1000000000000
max_batch = 64
{backend}runner = "pooling"
"""
    return f"""
[server]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin_port}"
max_body_bytes = 16777216
[tokenizer]
path = {json.dumps(str(tokenizer))}
[model]
served_names = ["{MODEL}"]
max_model_len = {MAX_MODEL_LEN}
default_max_tokens = 64
{backend}[[tenants]]
name = "parity"
api_keys = ["{KEY}"]
prefill_tokens_per_second = 100000000
decode_tokens_per_second = 100000000
requests_per_second = 100000
burst_seconds = 10
[usage_log]
path = {json.dumps(str(log))}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True, help="the tokengate binary")
    ap.add_argument("--vllm-url", required=True)
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--concurrency", type=int, default=3)
    ap.add_argument("--pooling", action="store_true",
                    help="the pooling routes' cases, against vLLM's pooling runner")
    a = ap.parse_args()

    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tokengate-parity-"))
    log = work / "usage.jsonl"
    port, admin_port = harness.free_port(), harness.free_port()
    procs = harness.Procs()
    generator = None
    if a.pooling:
        sim_port = harness.free_port()
        generator = f"http://127.0.0.1:{sim_port}"
        sim = procs.start([a.gateway, "sim", "--listen", f"127.0.0.1:{sim_port}", "--tokenizer",
                           str(ROOT / "assets" / "qwen3.5" / "tokenizer.json")],
                          open(work / "sim.log", "w"))
        harness.wait_http(f"{generator}/health", 30, sim)
    (work / "gateway.toml").write_text(
        gateway_config(a.vllm_url, port, admin_port, log, generator) + STILL_TENANT)
    failures, passed = [], 0
    try:
        gw = procs.start([a.gateway, "serve", "--config", str(work / "gateway.toml")],
                         open(work / "gateway.log", "w"))
        harness.wait_http(f"http://127.0.0.1:{admin_port}/readyz", 30, gw)
        t_gw = time.monotonic()
        if a.pooling:
            named = pooling_cases()
            cases = named + generated_pooling_cases(a.cases, a.seed)
        else:
            named = named_cases()
            cases = named + generated_cases(a.cases, a.seed)
        if a.only:
            cases = [c for c in cases if a.only in c["name"]]
        t_made = time.monotonic()
        # Greedy streams are compared with vLLM's own run of them: each runs alone, after the
        # rest, so that no other request shares their batches (batching can move a greedy
        # choice between near-equal logits); so do the cases that must have a batch to
        # themselves.
        alone = [(i, c) for i, c in enumerate(cases) if c["alone"]]
        together = [(i, c) for i, c in enumerate(cases) if (i, c) not in alone]
        with concurrent.futures.ThreadPoolExecutor(a.concurrency) as pool:
            results = list(pool.map(
                lambda ic: run_case(ic[1], "127.0.0.1", port, a.vllm_url, ic[0]), together))
        results += [run_case(c, "127.0.0.1", port, a.vllm_url, i) for i, c in alone]
        t_sent = time.monotonic()
        served = [r["rid"] for r in results if r["status"] == 200]
        lines, missing = read_log(log, served)
        for r in results:
            diff = judge(r, lines.get(r["rid"]))
            name = r["case"]["name"]
            known = KNOWN.get(name)
            if known is not None:
                expected, why = known
                if diff is None or not diff.startswith(expected):
                    failures.append((name, f"known difference changed: expected {expected!r} "
                                           f"({why}), got {diff!r}"))
                    continue
            elif diff is not None:
                failures.append((name, diff))
                continue
            passed += 1
        t_done = time.monotonic()
        # The parts that need a generating vLLM.
        for name, check in [] if a.pooling else [
                ("cached prefill", lambda: cached_prefill(port, admin_port, log)),
                ("local answers", lambda: local_answers(port, a.vllm_url, a.seed))]:
            found = check()
            failures += [(name, f) for f in found]
            passed += not found
    finally:
        procs.stop_all()
    if not a.pooling:
        found = reconciliation(a, work)
        failures += [("reconciliation", f) for f in found]
        passed += not found
    t_phases = time.monotonic()
    for name, diff in failures:
        print(f"DIFF {name}: {diff}")
    print(f"parity: gateway up in {t_gw - t0:.1f} s; {len(cases)} cases "
          f"({len(named)} named) made in {t_made - t_gw:.1f} s, sent in "
          f"{t_sent - t_made:.1f} s, judged in {t_done - t_sent:.1f} s; cached prefill and "
          f"reconciliation in {t_phases - t_done:.1f} s")
    print(f"parity: {passed} passed, {len(failures)} failed")
    if failures:
        print(f"parity: the gateway's log is in {work}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
