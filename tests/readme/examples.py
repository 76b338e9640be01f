#!/usr/bin/env python3
"""The README's console examples, run as written against the quickstart's deployment.

Starts `tokengate sim` and `tokengate serve` with config/quickstart.toml, as scripts/quickstart
does but on free loopback ports, then runs every `$ ` command of the README's ```console blocks
from the repository's root (the quickstart's addresses in a command replaced by the ports taken)
and checks its output line by line against the lines the README shows under it, where `[..]`
stands for any text within a line. Exits 1 naming each example whose output differs.

usage: tests/readme/examples.py --bin target/debug/tokengate [--readme README.md]
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The quickstart's addresses: the API, the admin listener and the simulated backend.
QUICKSTART = ("127.0.0.1:8080", "127.0.0.1:8081", "127.0.0.1:9000")


def examples(text):
    """(command, expected lines) of every `$ ` line in a ```console block, in order."""
    out, block = [], None
    for line in text.splitlines():
        if block is None:
            if line.strip() == "```console":
                block = []
            continue
        if line.strip() == "```":
            out.extend(block)
            block = None
        elif line.startswith("$ "):
            block.append((line[2:], []))
        elif block:
            block[-1][1].append(line)
    return out


def matches(pattern, line):
    parts = [re.escape(p) for p in pattern.split("[..]")]
    return re.fullmatch(".*".join(parts), line) is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url, proc, seconds):
    """Polls `url` until it answers 200, the process exits or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"readme: the gateway exited ({proc.returncode}) before {url} answered")
        try:
            if urllib.request.urlopen(url, timeout=1).status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"readme: {url} did not answer 200 within {seconds} s")


class Quickstart:
    """`tokengate sim` and `tokengate serve` with config/quickstart.toml, as scripts/quickstart
    starts them, on `addresses` (the API, the admin listener, the sim) in place of its own,
    ready when made; `stop()` ends both."""

    def __init__(self, bin_path, addresses, tmp):
        swap = dict(zip(QUICKSTART, addresses))
        with open(os.path.join(ROOT, "config", "quickstart.toml"), encoding="utf-8") as f:
            config = f.read()
        for old, new in swap.items():
            config = config.replace(old, new)
        # The copy lives elsewhere: its tokenizer path, relative to the original, made absolute.
        config = config.replace('"../assets/', '"' + os.path.join(ROOT, "assets") + "/")
        path = os.path.join(tmp, "quickstart.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(config)
        log = open(os.path.join(tmp, "log"), "w")
        self.procs = [subprocess.Popen(
            [bin_path, "sim", "--listen", addresses[2], "--tokenizer",
             os.path.join(ROOT, "assets", "qwen3.5", "tokenizer.json"),
             "--served-model-name", "qwen3.5-27b"], stdout=log, stderr=log)]
        try:
            self.procs.append(subprocess.Popen([bin_path, "serve", "--config", path],
                                               stdout=log, stderr=log))
            wait_ready(f"http://{addresses[1]}/readyz", self.procs[1], 30)
        except BaseException:
            self.stop()
            raise

    def stop(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(timeout=10)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True, help="the tokengate binary")
    p.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    a = p.parse_args()
    bin_path = os.path.abspath(a.bin)
    with open(a.readme, encoding="utf-8") as f:
        cases = examples(f.read())
    if not cases:
        sys.exit(f"readme: no console example in {a.readme}")

    ports = [f"127.0.0.1:{free_port()}" for _ in QUICKSTART]
    swap = dict(zip(QUICKSTART, ports))

    def local(text):
        for old, new in swap.items():
            text = text.replace(old, new)
        return text

    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        quickstart = Quickstart(bin_path, ports, tmp)
        try:
            for command, expected in cases:
                run = subprocess.run(["bash", "-c", local(command)], cwd=ROOT, text=True,
                                     capture_output=True, timeout=120)
                got = run.stdout.splitlines()
                ok = run.returncode == 0 and len(got) == len(expected) and all(
                    matches(local(e), g) for e, g in zip(expected, got))
                if not ok:
                    failed += 1
                    print(f"readme: `{command}` (exit {run.returncode}) printed:")
                    print("\n".join("  | " + g for g in got + run.stderr.splitlines()))
                    print("where the README shows:")
                    print("\n".join("  | " + e for e in expected))
        finally:
            quickstart.stop()
    print(f"readme: {len(cases) - failed} examples passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
