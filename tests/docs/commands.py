#!/usr/bin/env python3
"""Every `tokengate` command of docs/*.md, run as written after the quickstart.

As a reader would: from the repository's root, with the folder of the binary the quickstart built
first on PATH (README: `export PATH="$PWD/target/release:$PATH"`), and the quickstart's
deployment (`tokengate sim` and `tokengate serve --config config/quickstart.toml`) running on its
own addresses, 127.0.0.1:8080, 8081 and 9000. Each file is read top to bottom, and each fenced
block that holds a `tokengate` command is one of:

- a synopsis (a line with `[...]`, `|` or a placeholder such as FILE or URL): not typed as
  written; its subcommand must exist and every `--flag` it names must be in that subcommand's
  `--help`;
- examples (lines `$ COMMAND` followed by what it prints, one of them a `tokengate` command):
  each command is run by bash and its
  output (standard output, then standard error) compared line by line, `[..]` standing for any
  text within a line; it must exit 0 unless what it prints starts with `error:`. A `$ tokengate
  check-config NAME.toml` whose file is not in the repository reads the ```toml block shown
  before it, written as NAME.toml in a folder of its own where the example runs;
- a script (any other block): run by bash as one script, which must exit 0 within its bound.
  What it starts in the background keeps running for the file's later blocks and is stopped
  when the file is done. A file whose scripts start a server of their own runs with the
  quickstart stopped (they take its addresses); files they write into the repository's root
  (`> usage.jsonl`) are removed.

Blocks in ```text or ```json and blocks with no `tokengate` command are what something printed,
or commands of other tools, and are not run. Exits 1 naming each command that failed.

usage: tests/docs/commands.py --bin target/debug/tokengate [FILE.md ...]
"""

import argparse
import glob
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "readme"))
from examples import QUICKSTART, Quickstart, matches  # noqa: E402

# A command of the line: `tokengate` first, or after `$ `, `until ` or `(`.
COMMAND = re.compile(r"^(?:\$ |until |\()?\s*tokengate\s")
# What marks a synopsis: an optional part, alternatives, or an upper-case placeholder.
SYNOPSIS = re.compile(r"\[|\||\.\.\.|\b[A-Z][A-Z_]+\b")
SCRIPT_SECONDS = 300
EXAMPLE_SECONDS = 120


def blocks(text):
    """(language, [lines], the ```toml block before it or None) of each fenced block."""
    out, lang, lines, last_toml = [], None, None, None
    for line in text.splitlines():
        stripped = line.strip()
        if lines is None:
            if stripped.startswith("```"):
                lang, lines = stripped[3:], []
                indent = len(line) - len(line.lstrip())
            continue
        if stripped == "```":
            out.append((lang, lines, last_toml))
            if lang == "toml":
                last_toml = "\n".join(lines) + "\n"
            lines = None
            continue
        lines.append(line[indent:] if line[:indent].strip() == "" else line)
    return out


def joined(lines):
    """The lines with shell continuations (`\\`) and indented synopsis continuations joined."""
    out = []
    for line in lines:
        if out and (out[-1].endswith("\\") or (line[:1].isspace() and line.strip().startswith("["))):
            out[-1] = out[-1].rstrip("\\").rstrip() + " " + line.strip()
        else:
            out.append(line)
    return out


def examples(lines):
    """(command, expected lines) of each `$ ` line of a block."""
    out = []
    for line in lines:
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


class Runner:
    def __init__(self, bin_path):
        self.bin = bin_path
        self.env = dict(os.environ, PATH=os.path.dirname(bin_path) + os.pathsep + os.environ["PATH"])
        self.failed, self.passed, self.background = [], 0, []
        self.helps = {}

    def fail(self, where, what):
        self.failed.append(where)
        print(f"docs: {where}: {what}")

    def help_of(self, words):
        key = tuple(words)
        if key not in self.helps:
            run = subprocess.run([self.bin, *words, "--help"], capture_output=True, text=True)
            self.helps[key] = run.stdout if run.returncode == 0 else None
        return self.helps[key]

    def synopsis(self, where, line):
        words = line.split()[1:]
        sub = []
        for w in words:
            if not re.fullmatch(r"[a-z][a-z-]*", w):
                break
            if self.help_of(sub + [w]) is None:
                break
            sub.append(w)
        text = self.help_of(sub) if sub else None
        if text is None:
            return self.fail(where, f"`{line}` names no subcommand of tokengate")
        missing = [f for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", line) if f not in text]
        if missing:
            return self.fail(where, f"`{line}`: tokengate {' '.join(sub)} has no {', '.join(missing)}")
        self.passed += 1

    def bash(self, script, cwd, seconds):
        """Runs `script` in a session of its own and waits for it alone (not for what it leaves
        running in the background, which is kept to stop later): (exit status or None when it
        ran out of time, standard output, standard error)."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=self.env, text=True,
                                    stdout=out, stderr=err, start_new_session=True)
            self.background.append(proc.pid)
            try:
                code = proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            out.seek(0)
            err.seek(0)
            return code, out.read(), err.read()

    def stop_background(self):
        for pid in self.background:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        self.background = []

    def example(self, where, command, expected, toml):
        cwd, tmp = ROOT, None
        m = re.fullmatch(r"tokengate check-config (\S+\.toml)", command)
        if m and not os.path.exists(os.path.join(ROOT, m.group(1))):
            if toml is None:
                return self.fail(where, f"`{command}`: no ```toml block before it to write")
            tmp = tempfile.mkdtemp()
            with open(os.path.join(tmp, m.group(1)), "w", encoding="utf-8") as f:
                f.write(toml)
            os.symlink(os.path.join(ROOT, "assets"), os.path.join(tmp, "assets"))
            cwd = tmp
        code, out, err = self.bash(command, cwd, EXAMPLE_SECONDS)
        got = out.splitlines() + err.splitlines()
        may_fail = bool(expected) and expected[0].startswith("error:")
        ok = (code == 0 or (may_fail and code is not None)) and len(got) == len(expected) and all(
            matches(e, g) for e, g in zip(expected, got))
        if not ok:
            self.fail(where, f"`{command}` (exit {code}) printed:\n"
                      + "\n".join("  | " + g for g in got) + "\nwhere the doc shows:\n"
                      + "\n".join("  | " + e for e in expected))
        else:
            self.passed += 1

    def script(self, where, lines):
        before = set(os.listdir(ROOT))
        code, out, err = self.bash("set -e\n" + "\n".join(lines), ROOT, SCRIPT_SECONDS)
        for name in set(os.listdir(ROOT)) - before:
            os.remove(os.path.join(ROOT, name))
        if code != 0:
            tail = (out + err).splitlines()[-20:]
            self.fail(where, f"the script (exit {code}, bound {SCRIPT_SECONDS} s) ended with:\n"
                      + "\n".join("  | " + t for t in tail))
        else:
            self.passed += 1

    def file(self, path):
        name = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for n, (lang, lines, toml) in enumerate(blocks(text), 1):
            where = f"{name} block {n}"
            if lang in ("text", "json", "toml") or not any(COMMAND.match(l) for l in lines):
                continue
            lines = joined(lines)
            if any(l.startswith("$ ") for l in lines):
                cases = examples(lines)
                # Examples of another tool (scripts/compare-litellm's run) are its docs' business.
                if any(COMMAND.match(command) for command, _ in cases):
                    for command, expected in cases:
                        self.example(where, command, expected, toml)
            elif all(SYNOPSIS.search(l) for l in lines if COMMAND.match(l)):
                for line in lines:
                    if COMMAND.match(line):
                        self.synopsis(where, line.split("#")[0].strip())
            else:
                self.script(where, lines)


def takes_quickstart_addresses(text):
    """Whether a script of the doc starts a server on one of the quickstart's addresses."""
    for line in text.splitlines():
        m = re.match(r"\s*tokengate (sim|serve) (.*)", line)
        if not m:
            continue
        said = m.group(2)
        config = re.search(r"--config (\S+)", said)
        if config and os.path.isfile(os.path.join(ROOT, config.group(1))):
            with open(os.path.join(ROOT, config.group(1)), encoding="utf-8") as f:
                said += f.read()
        if any(address in said for address in QUICKSTART):
            return True
    return False


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bin", required=True, help="the tokengate binary")
    p.add_argument("files", nargs="*")
    a = p.parse_args()
    files = a.files or sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    for address in QUICKSTART:
        host, port = address.split(":")
        with socket.socket() as s:
            if s.connect_ex((host, int(port))) == 0:
                sys.exit(f"docs: {address} is taken: the docs' commands run on the quickstart's "
                         "addresses, so stop what listens there (a quickstart) first")
    runner = Runner(os.path.abspath(a.bin))
    with tempfile.TemporaryDirectory() as tmp:
        quickstart = None
        try:
            for path in files:
                with open(path, encoding="utf-8") as f:
                    own = takes_quickstart_addresses(f.read())
                if own and quickstart:
                    quickstart.stop()
                    quickstart = None
                if not own and not quickstart:
                    quickstart = Quickstart(runner.bin, QUICKSTART, tmp)
                try:
                    runner.file(path)
                finally:
                    runner.stop_background()
        finally:
            if quickstart:
                quickstart.stop()
    print(f"docs: {runner.passed} commands passed, {len(runner.failed)} failed")
    sys.exit(1 if runner.failed else 0)


if __name__ == "__main__":
    main()
