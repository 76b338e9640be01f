#!/usr/bin/env bash
# Shared helper: creates the project's Python virtualenv (.venv, git-ignored) with the reference
# libraries the fixture generators need, and activates it. Source it from a script:
#   . "$(dirname "$0")/lib/venv.sh"
# Idempotent: packages are installed only when an import fails.
set -euo pipefail

_tg_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_tg_venv="$_tg_root/.venv"

if [ ! -x "$_tg_venv/bin/python" ]; then
    python3 -m venv "$_tg_venv"
fi
if ! "$_tg_venv/bin/python" -c "import tokenizers, tiktoken, jinja2" 2>/dev/null; then
    "$_tg_venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        tokenizers tiktoken jinja2
fi
# shellcheck disable=SC1091
. "$_tg_venv/bin/activate"
unset _tg_root _tg_venv
