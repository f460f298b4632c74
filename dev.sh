#!/usr/bin/env bash
# One entry point for a fresh machine: sets up .venv (once, again when pyproject.toml changes), then
#   ./dev.sh test            ruff + the whole test suite
#   ./dev.sh <turnkit args>  runs the turnkit command line, e.g. ./dev.sh render --model default CONV.json
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.turnkit-installed

setup() {
    local want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
        return
    fi
    echo "dev.sh: setting up $VENV (first run only)" >&2
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
    # The CPU build of torch from this machine's local wheel (transformers needs it to read GGUF tokenizers).
    "$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0"
    "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[test]"
    echo "$want" > "$STAMP"
}

setup
if [ "${1:-}" = "test" ]; then
    shift
    "$VENV/bin/ruff" check src tests benchmarks
    "$VENV/bin/ruff" format --check src tests benchmarks
    exec "$VENV/bin/python" -m pytest "$@"
fi
exec "$VENV/bin/turnkit" "$@"
