"""KV admission against a real vLLM: a gateway whose backend says only `kv = "engine"` keeps the
engine from preempting while long requests flood it, and keeps a chat tenant's first tokens fast.

The engine is scripts/vllm-serve's toy Qwen3.5 with its cache cut to a few pages
(`--num-gpu-blocks-override`, `--max-model-len`, `--max-num-seqs`; prefix caching on or off, as
scripts/test starts it twice). The gateway learns the engine's geometry from the engine itself
(docs/capacity.md). Two phases run against the same engine, the flood's prompts new in each
(prefix caching must not help the second):

- direct: `--floods` long streamed chats (prompts that fit 5 pages and grow into a sixth with
  `max_tokens` 300 and `ignore_eos`) sent at once straight to vLLM, while a chat tenant streams short chats one after
  another, each timed to its first generated token;
- gated: the same through the gateway, the flood as tenant `flood` (standard) and the chats as
  tenant `chat` (critical), `admission.standard_share` keeping one chat's pages for the chats
  (the sizing docs/capacity.md gives).

Asserted, from vLLM's own metrics and the phases' timings in this one run:
- the gated phase moves `vllm:num_preemptions_total` by 0 (the direct one is reported);
- the most sequences running inside vLLM during it (sampled every 50 ms) is at least 90% of what
  its cache holds for those requests, by vLLM's own arithmetic of its `cache_config_info`: its
  usable pages over one flood request's pages (attention pages of its prompt + output, plus the
  state pages every sequence holds);
- every chat was admitted by the gateway at once (its queue wait under 8 ms): the pages kept for
  the critical tenant were free whenever it asked;
- what the gateway learned (`/admin/backends`) is the engine's page size, pages and state pages,
  and the vLLM version the engine says (`GET /version`; the config declares none), which
  `tokengate check-config` prints too;
- a chat whose `max_tokens` is the whole context is answered 200 by vLLM 0.32 and by the gateway
  (which, not knowing the version, would refuse it as older vLLMs do);
- a list of 8 prompts more than the engine's batch, together larger than its cache, each
  generating one token, is served through the gateway to the critical tenant as vLLM serves it
  (every choice, the same prompt tokens) with no preemption, run in turns while it holds the
  whole backend; the standard tenant, whose share is less than all of it, is refused it, and so
  is the list with 8 tokens each, whose answers would grow into pages the engine may not have.

The chat's times to first token and to its whole answer, direct and gated, are printed as ratios
of this run, not asserted: vLLM 0.32 defers a waiting request that does not fit and takes the
next, so a chat straight to the engine is not stuck behind the flood, and on a toy model a decode
step costs the same whatever the batch; the harm shows as preemptions (recomputed prefills) and
at the tail of the chats' times, which a shared two-core machine makes too noisy to assert.

    python tests/vllm/admission.py --gateway BINARY --vllm-url URL [--floods N] [--seed S]

Python standard library only. Ends with `admission: N passed, M failed`; exits 1 on a failure.
"""

import argparse
import concurrent.futures
import json
import math
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts" / "lib"))

import harness  # noqa: E402

MODEL = "qwen3.5-27b"
FLOOD_KEY, CHAT_KEY = "sk-flood", "sk-chat"
OUTPUT = 300
WORDS = ("river stone lantern orbit velvet harbor copper meadow signal quartz thunder pepper "
         "glacier saddle nimbus cobalt falcon harvest prism tundra").split()


def get_json(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def post_json(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def post_status(url, body, key):
    """(status, answer) of a POST of `body` with `key`, a refusal's answer included."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("content-type", "application/json")
    req.add_header("authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def engine_cache(vllm_url):
    """vLLM's `cache_config_info` labels and its context length."""
    text = harness.get(f"{vllm_url}/metrics")
    info = next(ls for n, ls, _ in harness.prom_samples(text) if n == "vllm:cache_config_info")
    models = get_json(f"{vllm_url}/v1/models")
    return info, models["data"][0]["max_model_len"]


def pages_of(info, max_model_len, tokens):
    """The pages one sequence of `tokens` holds, by vLLM's arithmetic: its attention pages plus
    the state pages of a request (what a request of max_model_len holds, num_gpu_blocks /
    kv_cache_max_concurrency, less its attention pages)."""
    block = int(info["block_size"])
    per_request = round(int(info["num_gpu_blocks"]) / float(info["kv_cache_max_concurrency"]))
    state = per_request - math.ceil(max_model_len / block)
    return math.ceil(tokens / block) + state, state


def chat_tokens(vllm_url, messages):
    return post_json(f"{vllm_url}/tokenize", {"model": MODEL, "messages": messages})["count"]


def flood_prompt(vllm_url, rng, low, high):
    """A user message whose chat prompt is within [low, high] tokens, by vLLM's count."""
    words = [rng.choice(WORDS) for _ in range(high)]
    lo, hi = 1, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        n = chat_tokens(vllm_url, [{"role": "user", "content": " ".join(words[:mid])}])
        if n <= high:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    n = chat_tokens(vllm_url, [{"role": "user", "content": text}])
    if not low <= n <= high:
        harness.fail(f"no prompt of {low}..{high} tokens: {n}")
    return text, n


def delivers_token(line):
    """Whether an SSE data line carries generated text (content or reasoning): vLLM sends its
    first event, the role alone, before the first token."""
    try:
        event = json.loads(line[6:])
    except ValueError:
        return False
    return any((c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("reasoning")
               for c in event.get("choices") or [])


def timed(host, port, body, key):
    """Streams `body` to /v1/chat/completions and reads it whole; returns (status, seconds to
    its first generated token, seconds to its end)."""
    started = time.monotonic()
    with send_chat(host, port, body, key, 600) as s:
        f = s.makefile("rb")
        status = int(f.readline().split()[1])
        first = None
        for line in f:
            if first is None and line.startswith(b"data: {") and delivers_token(line):
                first = time.monotonic() - started
        return status, first, time.monotonic() - started


def send_chat(host, port, body, key, timeout):
    """A new connection that has sent `body` to /v1/chat/completions (closed after the
    answer), for the caller to read the answer from."""
    payload = json.dumps(body).encode()
    head = [f"POST /v1/chat/completions HTTP/1.1", f"host: {host}:{port}",
            "content-type: application/json", f"content-length: {len(payload)}",
            f"authorization: Bearer {key}", "connection: close"]
    s = socket.create_connection((host, port), timeout=timeout)
    try:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
    except BaseException:
        s.close()
        raise
    return s


def first_status(host, port, body, key):
    """Streams `body` to /v1/chat/completions and returns the answer's status, closing the
    connection at its head (the engine then stops generating)."""
    with send_chat(host, port, body, key, 120) as s:
        return int(s.makefile("rb").readline().split()[1])


def vllm_version(vllm_url):
    """The engine's `GET /version` as the gateway reads it: MAJOR.MINOR.PATCH."""
    said = get_json(f"{vllm_url}/version")["version"]
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", said)
    return f"{m[1]}.{m[2]}.{m[3] or 0}"


def learned_version(admin_port, seconds=30):
    """What the gateway's /admin/backends says its backend runs, once it says anything (or
    None after `seconds`): its scrape loop asks the engine right after learning its pages."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        backend = get_json(f"http://127.0.0.1:{admin_port}/admin/backends")["backends"][0]
        if backend.get("vllm_version") is not None:
            return backend["vllm_version"]
        time.sleep(0.1)
    return None


class Sampler:
    """Samples vLLM's running requests every 50 ms until stopped: the most seen."""

    def __init__(self, vllm_url):
        self.url, self.most, self.stop = vllm_url, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop.wait(0.05):
            try:
                text = harness.get(f"{self.url}/metrics", timeout=2)
            except OSError:
                continue
            running = sum(v for n, _, v in harness.prom_samples(text)
                          if n == "vllm:num_requests_running")
            self.most = max(self.most, int(running))

    def done(self):
        self.stop.set()
        self.thread.join()
        return self.most


def preemptions(vllm_url):
    text = harness.get(f"{vllm_url}/metrics")
    return sum(v for n, _, v in harness.prom_samples(text) if n == "vllm:num_preemptions_total")


def phase(vllm_url, host, port, prompts, chat_body, floods_key, chat_key):
    """Sends the flood at once and chats one after another until it is answered; returns
    (flood statuses, chat (status, ttft) list, preemptions during it, most running)."""
    before = preemptions(vllm_url)
    sampler = Sampler(vllm_url)
    flood_done = threading.Event()
    chats = []

    def chatter():
        while not flood_done.is_set():
            chats.append(timed(host, port, chat_body, chat_key))

    flood_bodies = [{"model": MODEL, "messages": [{"role": "user", "content": p}],
                     "max_tokens": OUTPUT, "ignore_eos": True, "stream": True} for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts) + 1) as pool:
        chat_thread = pool.submit(chatter)
        flood = list(pool.map(lambda b: timed(host, port, b, floods_key),
                              flood_bodies))
        flood_done.set()
        chat_thread.result()
    most = sampler.done()
    return [s for s, *_ in flood], chats, preemptions(vllm_url) - before, most


def in_turns(vllm_url, port, admin_port, check):
    """More prompts than the engine's batch, together larger than its cache, none generating
    past its first token: vLLM runs them in turns, and the gateway admits them so for the
    critical chat tenant, whose class may hold the whole backend (every prompt answered, the
    same prompt tokens, no preemption); the flood's class, kept from the chats' part, is refused
    them, and so is the same list with answers that grow past the pages they start with."""
    batch = get_json(f"http://127.0.0.1:{admin_port}/admin/backends")["backends"][0]["max_batch"]
    many = {"model": MODEL, "prompt": [f"{WORDS[i % len(WORDS)]} {i}" for i in range(batch + 8)],
            "max_tokens": 1}
    before = preemptions(vllm_url)
    answers = [post_status(f"{vllm_url}/v1/completions", many, "none"),
               post_status(f"http://127.0.0.1:{port}/v1/completions", many, CHAT_KEY)]
    preempted = preemptions(vllm_url) - before
    seen = [(status, len(answer.get("choices", [])), (answer.get("usage") or {}).get("prompt_tokens"))
            for status, answer in answers]
    check(seen[0][:2] == (200, batch + 8) and seen[1] == seen[0] and preempted == 0,
          f"{batch + 8} prompts of one token each on a batch of {batch}: (status, choices, "
          f"prompt tokens) vLLM {seen[0]}, the gateway {seen[1]}; {preempted:.0f} preemptions")
    refused = [post_status(f"http://127.0.0.1:{port}/v1/completions", many, FLOOD_KEY),
               post_status(f"http://127.0.0.1:{port}/v1/completions",
                           dict(many, max_tokens=8), CHAT_KEY)]
    check([(s, a["error"]["code"]) for s, a in refused] == [(400, "exceeds_kv_capacity")] * 2,
          f"the same prompts from the standard tenant, and growing: {refused}")
    print(f"admission: {batch + 8} prompts of one token each served in turns through the "
          f"gateway, {seen[1][2]} prompt tokens as vLLM counts them, {preempted:.0f} preemptions")


def gateway_config(vllm_url, port, admin_port, standard_share):
    tokenizer = ROOT / "assets" / "qwen3.5" / "tokenizer.json"
    return f"""
[server]
listen = "127.0.0.1:{port}"
admin_listen = "127.0.0.1:{admin_port}"
[tokenizer]
path = {json.dumps(str(tokenizer))}
[model]
served_names = ["{MODEL}"]
max_model_len = 4096
default_max_tokens = 64
[admission]
queue_max_waiting = 64
queue_deadline = "600s"
standard_share = {standard_share}
[[backends]]
url = "{vllm_url}"
kv = "engine"
first_byte_timeout = "600s"
[[tenants]]
name = "flood"
api_keys = ["{FLOOD_KEY}"]
prefill_tokens_per_second = 100000000
decode_tokens_per_second = 100000000
requests_per_second = 100000
[[tenants]]
name = "chat"
api_keys = ["{CHAT_KEY}"]
priority = "critical"
prefill_tokens_per_second = 100000000
decode_tokens_per_second = 100000000
requests_per_second = 100000
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateway", required=True, help="the tokengate binary")
    ap.add_argument("--vllm-url", required=True)
    ap.add_argument("--floods", type=int, default=12)
    ap.add_argument("--seed", type=int, default=44)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    failures, passed = [], 0

    def check(ok, what):
        nonlocal passed
        if ok:
            passed += 1
        else:
            failures.append(what)

    info, max_model_len = engine_cache(a.vllm_url)
    block = int(info["block_size"])
    usable = int(info["num_gpu_blocks"]) - 1
    # Prompts that fit 5 pages and answers that grow into a sixth: an engine that admits by
    # its free pages now must find that page later, or preempt.
    low, high = 5 * block + 1 - OUTPUT, 5 * block - 20
    prompts = [flood_prompt(a.vllm_url, rng, low, high) for _ in range(2 * a.floods)]
    flood_pages, state = pages_of(info, max_model_len, high + OUTPUT)
    assert all(pages_of(info, max_model_len, n + OUTPUT)[0] == flood_pages for _, n in prompts)
    holds = usable // flood_pages
    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}],
                 "max_tokens": 16, "stream": True}
    chat_pages, _ = pages_of(info, max_model_len,
                             chat_tokens(a.vllm_url, chat_body["messages"]) + 16)
    # The share that keeps one chat's pages free of the flood (docs/capacity.md).
    standard_share = round(1 - chat_pages / usable, 3)
    print(f"admission: engine {usable} usable pages of {block} tokens, {state} state pages a "
          f"sequence, prefix caching {info['enable_prefix_caching']}; a flood request holds "
          f"{flood_pages} pages ({holds} fit), a chat {chat_pages}; standard_share "
          f"{standard_share}")

    t0 = time.monotonic()
    direct = phase(a.vllm_url, "127.0.0.1", int(a.vllm_url.rsplit(":", 1)[1]),
                   [p for p, _ in prompts[:a.floods]], chat_body, "none", "none")
    t_direct = time.monotonic() - t0

    work = Path(tempfile.mkdtemp(prefix="tokengate-admission-"))
    port, admin_port = harness.free_port(), harness.free_port()
    (work / "gateway.toml").write_text(
        gateway_config(a.vllm_url, port, admin_port, standard_share))
    procs = harness.Procs()
    try:
        gw = procs.start([a.gateway, "serve", "--config", str(work / "gateway.toml")],
                         open(work / "gateway.log", "w"))
        harness.wait_http(f"http://127.0.0.1:{admin_port}/readyz", 30, gw)
        learned = None
        deadline = time.monotonic() + 30
        while learned is None and time.monotonic() < deadline:
            backend = get_json(f"http://127.0.0.1:{admin_port}/admin/backends")["backends"][0]
            learned = (backend.get("observed") or {}).get("engine_kv")
            time.sleep(0.1)
        check(learned is not None
              and (learned["page_tokens"], learned["pages"],
                   learned["state_pages_per_sequence"]) == (block, usable, state),
              f"the gateway learned {learned}, the engine has {block}-token pages, "
              f"{usable} usable, {state} state pages")
        said = learned_version(admin_port)
        check(said == {"version": vllm_version(a.vllm_url), "source": "learned"},
              f"the gateway learned vLLM {said}, the engine says {vllm_version(a.vllm_url)}")
        checked = subprocess.run([a.gateway, "check-config", str(work / "gateway.toml")],
                                 capture_output=True, text=True, timeout=60).stdout
        says = get_json(f"{a.vllm_url}/version")["version"]
        check(f"engine of backends[0] runs vLLM {says} (GET /version)\n" in checked,
              f"check-config does not say the engine runs vLLM {says}: {checked}")
        t1 = time.monotonic()
        gated = phase(a.vllm_url, "127.0.0.1", port, [p for p, _ in prompts[a.floods:]],
                      chat_body, FLOOD_KEY, CHAT_KEY)
        t_gated = time.monotonic() - t1
        waits = harness.get(f"http://127.0.0.1:{admin_port}/metrics")
        # An output limit of the whole context: vLLM 0.32 serves it with what the context
        # leaves, and so does the gateway, having learned the version (undeclared, it refuses).
        whole = dict(chat_body, max_tokens=max_model_len)
        statuses = [first_status("127.0.0.1", int(a.vllm_url.rsplit(":", 1)[1]), whole, "none"),
                    first_status("127.0.0.1", port, whole, CHAT_KEY)]
        check(statuses == [200, 200],
              f"max_tokens = max_model_len: vLLM answered {statuses[0]}, the gateway {statuses[1]}")
        in_turns(a.vllm_url, port, admin_port, check)
    finally:
        procs.stop_all()

    def waited(tenant, within):
        """(requests of `tenant` admitted, of them within `within` seconds of arriving)."""
        total = harness.metric(waits, "tokengate_queue_wait_seconds_count", tenant=tenant)
        fast = harness.metric(waits, "tokengate_queue_wait_seconds_bucket", tenant=tenant,
                              le=within)
        return int(total), int(fast)

    chats_admitted, at_once = waited("chat", "0.008")
    check(chats_admitted == len(gated[1]) == at_once,
          f"gated: of {chats_admitted} chats, {at_once} admitted within 8 ms "
          f"({len(gated[1])} sent): the critical tenant's pages were not kept free")
    floods_admitted, floods_at_once = waited("flood", "0.008")
    print(f"admission: gated: {chats_admitted} chats all admitted at once; "
          f"{floods_admitted - floods_at_once} of {floods_admitted} flood requests waited in "
          f"the gateway's queue")

    def quantiles(chats, i):
        xs = sorted(c[i] for c in chats if c[0] == 200 and c[i] is not None)
        return (statistics.median(xs), xs[int(0.95 * (len(xs) - 1))]) if xs else (0.0, 0.0)

    for name, (floods, chats, preempted, most) in [("direct", direct), ("gated", gated)]:
        check(floods == [200] * a.floods and chats and all(c[0] == 200 for c in chats),
              f"{name}: flood statuses {floods}, chats {chats[:5]}")
        (t50, t95), (e50, e95) = quantiles(chats, 1), quantiles(chats, 2)
        print(f"admission: {name}: {preempted:.0f} preemptions, at most {most} running in "
              f"vLLM; {len(chats)} chats: first token p50 {t50:.2f} s p95 {t95:.2f} s, "
              f"whole answer p50 {e50:.2f} s p95 {e95:.2f} s")
    _, direct_chats, direct_preempted, _ = direct
    _, gated_chats, gated_preempted, gated_most = gated
    check(gated_preempted == 0, f"gated: vLLM preempted {gated_preempted:.0f} times")
    check(gated_most >= 0.9 * holds,
          f"gated: at most {gated_most} ran in vLLM, under 90% of the {holds} its cache holds")
    direct_end, gated_end = quantiles(direct_chats, 2)[0], quantiles(gated_chats, 2)[0]
    ratio = [g / d if d else float("nan")
             for g, d in zip(quantiles(gated_chats, 1), quantiles(direct_chats, 1))]
    print(f"admission: gated / direct: chat first token p50 {ratio[0]:.2f}x, p95 {ratio[1]:.2f}x; "
          f"whole chat p50 {gated_end / direct_end:.2f}x; direct preempted "
          f"{direct_preempted:.0f} times; phases {t_direct:.0f} s and {t_gated:.0f} s")
    for f in failures:
        print(f"FAIL {f}")
    print(f"admission: {passed} passed, {len(failures)} failed")
    if failures:
        print(f"admission: the gateway's log is in {work}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
