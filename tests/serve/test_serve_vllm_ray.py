"""``turnkit serve --ray --engine vllm``: one Ray Serve replica running vLLM's engine in process, on a local Ray
instance ``turnkit serve`` starts itself, behind Serve's HAProxy ingress, through the official ``openai`` client.

It runs in ``.venv-vllm`` (vLLM and Ray both installed there: the ``vllm-test`` extra), like test_serve_vllm.py; in
``.venv`` it skips. One start serves the module (the replica converts nothing new: the embedded model's folder is
cached by test_serve_vllm.py's run or made once; vLLM's start is most of the time). Every process the server starts
(Ray's, HAProxy, the replica, vLLM's engine process) carries a marker in its environment: teardown checks that stopping
the server left none of them, and kills any it did leave (``ray stop`` would stop other sessions' Ray too).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_paths import REPO

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed in this venv: tests/serve/test_serve_vllm_ray.py runs in .venv-vllm "
    "(./dev.sh vllm-setup, then ./dev.sh vllm-test)",
)
pytest.importorskip("ray.serve")

import httpx
import openai
from serve_harness import VLLM_EAGER, free_port, wait_until_up, whole_and_streamed
from test_serve_ray import MARKER, _kill_marked, _marked, _replicas
from test_serve_vllm import FORGED

from turnkit import ChatFormat
from turnkit.serve.replicas import _HAPROXY_PORTS

SRC = REPO / "src"


@pytest.fixture(scope="module")
def endpoint(smollm2_gguf) -> Iterator[tuple[str, str]]:
    """``turnkit serve --ray --engine vllm`` with one replica on a local Ray instance; yields (URL, marker)."""
    marker = secrets.token_hex(8)
    env = {
        **os.environ,
        MARKER: marker,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONPATH": str(SRC),
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        # HAProxy's listeners on free ports (another HAProxy may hold Ray's fixed ones)
        **{name: str(free_port()) for name in _HAPROXY_PORTS},
    }
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    command = [sys.executable, "-m", "turnkit.cli", "serve", "--ray", "--replicas", "1", "--threads", "2"]
    command += ["--engine", "vllm", "--model", str(smollm2_gguf), "--model-id", "smollm2", "--port", str(port)]
    command += ["--context", "2048", "--max-batch", "4", "--max-queue", "8", "--vllm-arg", "dtype=bfloat16"]
    command += VLLM_EAGER
    log = Path(tempfile.gettempdir()) / f"turnkit-serve-vllm-ray-{port}.log"
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_up(url, process, timeout=600, announced=log)
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-4000:]}") from None
        yield url, marker
        # stopping stops the local Ray instance it started: the replica, vLLM's engine process, HAProxy, Ray's own
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) == 0, log.read_text()[-4000:]
        deadline = time.monotonic() + 60
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(1)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in _marked(marker)}
        assert not left, left
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
        _kill_marked(marker)


@pytest.fixture(scope="module")
def client(endpoint) -> openai.OpenAI:
    return openai.OpenAI(base_url=endpoint[0] + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_one_replica_serves_chat_whole_and_streamed(endpoint, client):
    """The same greedy request whole and streamed, through HAProxy to the one replica: the stream spells the whole
    answer and counts the same tokens."""
    assert len(_replicas(endpoint[1], "turnkit")) == 1
    (model,) = client.models.list().data
    assert model.id == "smollm2"
    whole, _chunks = whole_and_streamed(client, [{"role": "user", "content": "What is the capital of France?"}])
    assert whole.choices[0].message.content.strip()
    assert whole.choices[0].finish_reason in ("stop", "length")


def test_a_forged_turn_stays_text(endpoint, client, smollm2_gguf):
    """A user who types ChatML's markers writes text: the replica's prompt is ``fmt.encode``'s (3 ``<|im_start|>``:
    the default system turn, the user's, the reply's), as ``/tokenize`` and the reply's usage both count it."""
    messages = [{"role": "user", "content": FORGED}]
    encoding = ChatFormat.from_pretrained(smollm2_gguf).encode(messages, add_generation_prompt=True)
    expected = [int(token) for token in encoding.input_ids]
    assert encoding.control_counts["<|im_start|>"] == 3
    tokens = httpx.post(endpoint[0] + "/tokenize", json={"messages": messages}, timeout=60).json()["tokens"]
    assert tokens == expected
    reply = client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=4)
    assert reply.choices[0].message.content is not None
    assert reply.usage.prompt_tokens == len(expected)


def test_health_names_the_vllm_engine_on_the_replicas_loop(endpoint, client):
    """``/health`` (answered by the replica) names vLLM, with what it was given; after the requests above vLLM runs
    on the event loop the replica's app started on (its lifespan ran there), not on a thread of its own."""
    from importlib.metadata import version

    client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    health = httpx.get(endpoint[0] + "/health", timeout=60).json()
    (model,) = health["models"]
    engine = model["engine"]
    assert (model["id"], engine["engine"], engine["release"]) == ("smollm2", "vllm", version("vllm-cpu"))
    assert engine["args"]["dtype"] == "bfloat16" and engine["args"]["max_num_seqs"] == 4
    assert engine["max_model_len"] == 2048 and engine["kv_cache_tokens"] > 0
    assert engine["loop"] == "server"
