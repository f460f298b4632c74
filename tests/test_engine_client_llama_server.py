"""turnkit.engine_client against a real llama.cpp ``llama-server`` on the embedded model (issue 46).

The binary is ``TURNKIT_LLAMA_SERVER``, else ``llama-server`` on ``PATH``: built from the pinned llama-cpp-python
sdist's ``vendor/llama.cpp`` as docs/guides/agent-rl.md says (the server target alone, portable: 9.4 CPU-minutes,
36 minutes of wall time on a 2-core machine busy with other work). Without it the module skips, naming that;
``./dev.sh test`` under ``CI=true``, where a skip fails, does not run it (``LOCAL_ENGINE_TESTS``): CI does not build
llama-server.

* A four-reply episode through ``/completion`` with token prompts, a tool result and user turns between the
  replies, the last cut by its budget: the ids the server returned (``tokens``) are the ids the trajectory appended;
  it evaluated a prompt of the trajectory's length, and its prompt cache shows turn N's prompt starts with turn
  N-1's prompt and sampled ids (it evaluates only the delta and the last sampled id); the stop id (``<|im_end|>``) is
  among the returned ids of a finished reply, none in the cut one; one log-probability per sampled id, named by that
  id, the top-1 of a greedy draw.
* The rows: turn 1's prompt, each reply and delta; labels on exactly the sampled ids, their log-probabilities kept.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from serve_harness import free_port, wait_until_up

from turnkit import ChatFormat
from turnkit.encode.encoding import IGNORE_INDEX
from turnkit.engine_client import LLAMA_SERVER, EngineClient


def llama_server_binary() -> str | None:
    """``TURNKIT_LLAMA_SERVER`` (a path), else ``llama-server`` on ``PATH``; ``None`` when neither is there."""
    given = os.environ.get("TURNKIT_LLAMA_SERVER")
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"TURNKIT_LLAMA_SERVER={given} is not a file")
        return given
    return shutil.which("llama-server")


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    binary = llama_server_binary()
    if binary is None:
        pytest.skip("no llama-server: set TURNKIT_LLAMA_SERVER or put it on PATH (docs/guides/agent-rl.md builds it)")
    port = free_port()
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"llama-server-{port}.log"
    command = [binary, "--model", str(smollm2_gguf), "--host", "127.0.0.1", "--port", str(port), "--threads", "1"]
    command += ["--ctx-size", "2048", "--parallel", "1", "--no-webui"]
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.fixture(scope="module")
def fmt(smollm2_gguf):
    return ChatFormat.from_pretrained(smollm2_gguf)


def test_a_trajectory_sampled_from_llama_server(server, fmt):
    client = EngineClient(server, LLAMA_SERVER, max_tokens=24, temperature=0)
    traj = fmt.trajectory([{"role": "user", "content": "What is the capital of Germany?"}])
    samples, deltas = [], []
    between = [
        [{"role": "tool", "content": "population: 3.7 million"}],
        [{"role": "user", "content": "And of France?"}],
        [{"role": "user", "content": "Tell me about both at length."}],
        [],
    ]
    for turn, messages in enumerate(between):
        # the last reply is cut by its budget: no stop id, and the server says it hit its limit
        sample = client.sample(traj, max_tokens=4 if turn == len(between) - 1 else None)
        samples.append(sample)
        answer = sample.response
        # the ids the server returned are the ids appended; it evaluated the trajectory's prompt, as ids
        assert sample.ids == answer["tokens"] and sample.ids
        assert answer["tokens_evaluated"] == len(sample.prompt_ids)
        if turn:
            assert sample.prompt_ids == samples[-2].prompt_ids + samples[-2].ids + deltas[-1]
            # the server's own prompt cache agrees: it found the last prompt and reply in its KV cache (all but the
            # reply's last id, sampled and never decoded) as this prompt's start, and evaluated only the rest
            reused = len(sample.prompt_ids) - answer["timings"]["prompt_n"]
            assert reused == len(samples[-2].prompt_ids) + len(samples[-2].ids) - 1
        stopped = sample.ids[-1] in fmt.stop_ids
        assert sample.reply.finish_reason == ("stop" if stopped else "length")
        assert answer["stop_type"] == ("eos" if stopped else "limit")
        # one log-probability per sampled id, named by it; greedy drew each position's likeliest
        probs = answer["completion_probabilities"]
        assert [entry["id"] for entry in probs] == sample.ids
        assert sample.logprobs == [entry["logprob"] for entry in probs]
        assert all(math.isfinite(value) and value <= 0 for value in sample.logprobs)
        assert all(entry["top_logprobs"][0]["id"] == entry["id"] for entry in probs)
        if messages:
            deltas.append(traj.add_messages(messages))
    finish_reasons = [sample.reply.finish_reason for sample in samples]
    assert finish_reasons[0] == "stop" and finish_reasons[-1] == "length" and len(samples[-1].ids) == 4

    (row,) = traj.rows
    assert row.input_ids == samples[-1].prompt_ids + samples[-1].ids
    sampled = [position for position, label in enumerate(row.labels) if label != IGNORE_INDEX]
    assert [row.input_ids[p] for p in sampled] == [i for sample in samples for i in sample.ids]
    assert [row.logprobs[p] for p in sampled] == [value for sample in samples for value in sample.logprobs]
