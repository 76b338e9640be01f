"""Shared by the scripts that start `tokengate sim` and `tokengate serve` on 127.0.0.1 and drive
them (scripts/bench-sla, scripts/soak): free ports, bounded readiness waits, processes stopped on
exit, and Prometheus text read back. Python standard library only.

`fail` exits with a message prefixed by the running script's name.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TOKENIZER = ROOT / "assets" / "qwen3.5" / "tokenizer.json"
PROG = Path(sys.argv[0]).name


def fail(message):
    """Exits non-zero with `message`, prefixed by the script's name."""
    sys.exit(f"{PROG}: {message}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_http(url, seconds, proc):
    """Polls url until it answers 200, for at most `seconds`; fails if proc exits first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            fail(f"{proc.args[1]} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    fail(f"{url} not ready within {seconds} s")


def tokengate(build=True):
    """The release `tokengate` binary, built unless `build` is false; the tokenizer is fetched
    with it if missing."""
    if build:
        subprocess.run(["cargo", "build", "--release", "--locked", "--bin", "tokengate"],
                       cwd=ROOT, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    binary = str((ROOT / target / "release" / "tokengate").resolve())
    if not TOKENIZER.exists():
        subprocess.run([ROOT / "scripts" / "fetch-tokenizer", binary], check=True)
    return binary


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def prom_samples(text):
    """Prometheus text as a list of (name, {label: value}, float), comments skipped."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def metric(text, name, **labels):
    """The value of the one sample `name` with exactly these labels; KeyError when missing."""
    for n, ls, v in prom_samples(text):
        if n == name and ls == labels:
            return v
    raise KeyError(f"{name}{labels or ''} missing from /metrics")


class Procs:
    """Started processes, stopped (SIGTERM, then SIGKILL after 5 s) on exit."""

    def __init__(self):
        self.procs = []

    def start(self, args, log, env=None):
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        self.procs.append(p)
        return p

    def stop(self, p):
        """Stops one of them."""
        self._stop([p])
        self.procs.remove(p)

    def stop_all(self):
        self._stop(self.procs)
        self.procs = []

    @staticmethod
    def _stop(procs):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def render_config(config, text, scale, sim_port, port, admin_port, out):
    """`text` (of the file `config`, written in the card's time) for a run: its addresses on
    the given 127.0.0.1 ports, the tokenizer's absolute path, and for a sim `scale` times faster
    than real time every *_per_second multiplied and burst_seconds and queue_deadline divided by
    `scale` (bucket capacities unchanged). Written to `out`."""
    per_s = lambda m: f"{m.group(1)}{float(m.group(2)) * scale:g}"
    text = re.sub(r"^(\w+_per_second = )([\d.]+)", per_s, text, flags=re.M)
    per_scale = lambda m: f"{m.group(1)}{float(m.group(2)) / scale:g}"
    text = re.sub(r"^(burst_seconds = )([\d.]+)", per_scale, text, flags=re.M)

    def deadline(m):
        ms = int(m.group(2)) if m.group(3) == "ms" else int(m.group(2)) * 1000
        return f'{m.group(1)}"{max(1, round(ms / scale))}ms"'

    text = re.sub(r'^(queue_deadline = )"(\d+)(ms|s)"', deadline, text, flags=re.M)
    subs = {
        r'^listen = ".*"': f'listen = "127.0.0.1:{port}"',
        r'^admin_listen = ".*"': f'admin_listen = "127.0.0.1:{admin_port}"',
        r'^url = ".*"': f'url = "http://127.0.0.1:{sim_port}"',
        r'^path = ".*"': f"path = {json.dumps(str(TOKENIZER))}",
    }
    for pattern, line in subs.items():
        text, n = re.subn(pattern, line, text, count=1, flags=re.M)
        if n != 1:
            fail(f"{config} has no line matching {pattern}")
    out.write_text(text)
