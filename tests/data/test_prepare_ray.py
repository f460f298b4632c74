"""``turnkit prepare --runner ray --ray-address`` on a real two-node Ray cluster, started on this machine for the test
(``ray start --head`` and a second ``ray start --address``, with token authentication) and torn down after: its shards
and counts equal the local runner's, and both nodes did work."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import turnkit
from turnkit.data import PrepareConfig, load_rows, prepare

pytest.importorskip("ray")
RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ours(marker: str) -> list[int]:
    """Processes whose command line names this cluster's own temporary folder (nothing else is touched)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    if RAY is None:
        pytest.skip("the ray command is not installed")
    temp = tempfile.mkdtemp(prefix="tkray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    port = _free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",  # a second node is refused without it (InvalidAuthToken)
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "PYTHONPATH": os.pathsep.join([str(Path(turnkit.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false",
    }
    common = ["--block", "--num-cpus", "1", "--disable-usage-stats"]
    log = Path(temp) / "nodes.log"
    nodes = []
    with log.open("wb") as sink:
        head = [RAY, "start", "--head", "--port", str(port), "--temp-dir", temp, "--include-dashboard=false"]
        nodes.append(subprocess.Popen([*head, *common], env=env, stdout=sink, stderr=sink, start_new_session=True))
        address = f"127.0.0.1:{port}"
        try:
            _wait_for_nodes(address, env, 1)
            second = [RAY, "start", "--address", address, *common]
            nodes.append(subprocess.Popen(second, env=env, stdout=sink, stderr=sink, start_new_session=True))
            _wait_for_nodes(address, env, 2)
            yield address, env
        finally:
            for node in reversed(nodes):  # `ray start --block` stops what it started when it is terminated
                node.send_signal(signal.SIGTERM)
            for node in reversed(nodes):
                try:
                    node.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    node.kill()
            for pid in _ours(temp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(temp, ignore_errors=True)


def _wait_for_nodes(address: str, env: dict[str, str], count: int, timeout: float = 180) -> None:
    script = (
        "import ray, sys\n"
        f"ray.init(address={address!r}, log_to_driver=False, configure_logging=False)\n"
        "alive = [n for n in ray.nodes() if n['Alive'] and n['Resources'].get('CPU')]\n"
        "sys.exit(0 if len(alive) >= int(sys.argv[1]) else 1)\n"
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = subprocess.run([sys.executable, "-c", script, str(count)], env=env, capture_output=True, timeout=120)
        if done.returncode == 0:
            return
        time.sleep(2)
    pytest.fail(f"the Ray cluster at {address} did not reach {count} nodes")


def test_ray_cluster_gives_the_local_runners_shards_and_counts(tmp_path, cluster, smollm2_hf_folder):
    address, env = cluster
    good = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}
    lines = []
    for n in range(40):
        record = {
            "id": f"r{n}",
            "messages": [{"role": "user", "content": f"question {n} " * (n % 7 + 1)}, good["messages"][1]],
        }
        lines.append(json.dumps(record))
    lines[5] = "{broken"
    lines[9] = json.dumps({"id": "r9", "conversations": [{"from": "alien", "value": "x"}]})
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    rows = tmp_path / "rows.parquet"  # the actors make records of the bytes they are sent: JSONL lines, Arrow rows
    pq.write_table(pa.Table.from_pylist([json.loads(line) for line in lines[10:21]]), rows, row_group_size=3)

    model = str(smollm2_hf_folder)
    inputs = [str(data), str(rows)]
    local = prepare(inputs, tmp_path / "local", PrepareConfig(model=model), shard_records=4, progress=False)
    command = [sys.executable, "-m", "turnkit.cli", "prepare", *inputs, "--model", model, "--out"]
    options = ["--runner", "ray", "--workers", "2", "--ray-address", address, "--shard-records", "4"]
    done = subprocess.run([*command, str(tmp_path / "ray"), *options], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    ray = json.loads((tmp_path / "ray" / "manifest.json").read_text())

    assert ray["counts"] == local["counts"] and ray["counts"]["rejected"] == 2 and ray["counts"]["read"] == 51
    assert ray["tokens"] == local["tokens"] and ray["trained_tokens"] == local["trained_tokens"]
    assert ray["files"] == local["files"]  # shard by shard, the same files
    assert list(load_rows(tmp_path / "ray")) == list(load_rows(tmp_path / "local"))
    assert (tmp_path / "ray" / "rejects.jsonl").read_text() == (tmp_path / "local" / "rejects.jsonl").read_text()
    summaries = [json.loads(p.read_text()) for p in (tmp_path / "ray" / "shards").glob("shard-*.json")]
    assert len({s["ray_node"] for s in summaries}) == 2  # both nodes of the cluster did work
