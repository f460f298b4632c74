"""``turnkit serve``'s command line as a user meets it: the port is checked and bound before any model is read (out of
range, in use, and ``--port 0`` announcing the port it got), flags that would do nothing beside the others are refused
in one line, ``--template FILE`` / ``--family NAME`` replace the one model's template as in ``generate``, and the torch
engine's GGUF conversion draws progress bars on a terminal only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pexpect
import pytest
from serve_harness import turnkit_serve, wait_until_up

from turnkit.cli import main

TURNKIT = [sys.executable, "-m", "turnkit.cli"]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@contextmanager
def _taken_port() -> Iterator[int]:
    """A loopback port another program listens on for the block's duration."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def _one_error(err: str) -> str:
    """The only line of stderr, which must be turnkit's error line."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("turnkit: error: "), err
    return lines[0].removeprefix("turnkit: error: ")


# -- the port -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_one_line(port, capsys):
    assert main(["serve", "--port", port]) == 2
    assert _one_error(capsys.readouterr().err) == f"--port must be between 1 and 65535 (or 0: a free port), not {port}"


def test_a_port_in_use_fails_at_once_before_reading_the_model(tmp_path):
    """The embedded model's server, and one of a file that is no model at all: the port's error either way, so no
    model was read first (a clock cannot tell that on a busy machine; the broken file's read would fail first)."""
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a GGUF file")
    with _taken_port() as port:
        for model in ([], ["--model", str(broken)]):
            command = [*TURNKIT, "serve", *model, "--port", str(port)]
            result = subprocess.run(command, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
            assert result.returncode == 2, result.stderr
            assert _one_error(result.stderr) == (
                f"cannot listen on 127.0.0.1:{port}: the port is in use (another server, or a turnkit serve still "
                "running); pick another --port"
            )


def test_a_host_that_is_not_this_machines_is_named(capsys):
    assert main(["serve", "--host", "192.0.2.1"]) == 2  # TEST-NET-1: never a local address
    assert _one_error(capsys.readouterr().err).startswith(
        "cannot listen on 192.0.2.1:8000: 192.0.2.1 is not an address of this machine"
    )


def test_port_0_serves_on_the_port_it_announces(tmp_path):
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [*TURNKIT, "serve", "--port", "0", "--lazy", "--threads", "1"], stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 240
        while "turnkit: serving" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text()
        (serving,) = [line for line in text.splitlines() if line.startswith("turnkit: serving")]
        url = serving.split(" on ", 1)[1].split("/v1", 1)[0]
        port = int(url.rsplit(":", 1)[1])
        assert url == f"http://127.0.0.1:{port}" and port > 0
        assert f"turnkit: playground at {url}/ " in text
        wait_until_up(url, process)
        assert httpx.get(url + "/health").json()["status"] == "ok"
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0


def test_ray_checks_its_port_before_starting_ray(capsys):
    assert main(["serve", "--ray", "--port", "0"]) == 2
    assert _one_error(capsys.readouterr().err) == "--port must be between 1 and 65535 for --ray's endpoint, not 0"
    with _taken_port() as port:
        assert main(["serve", "--ray", "--port", str(port)]) == 2
    assert "the port is in use" in _one_error(capsys.readouterr().err)


# -- flags that would do nothing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--replicas", "2"], "--replicas goes with --ray (replicas on Ray Serve): add --ray, or drop --replicas"),
        (["--autoscale", "1:3"], "--autoscale goes with --ray (replicas on Ray Serve): add --ray, or drop --autoscale"),
        (["--ray-ingress", "proxy"], "--ray-ingress goes with --ray"),
        (["--ray-address", "auto"], "--ray-address goes with --ray"),
        (["--ray", "--replicas", "2", "--autoscale", "1:3"], "--replicas and --autoscale exclude each other"),
        (["--ray", "--drain-seconds", "5"], "--drain-seconds is for turnkit serve without --ray"),
        (["--metrics-public"], "--metrics-public exempts /metrics from --api-key; without --api-key it is public"),
        (
            ["--engine", "torch", "--kv-tokens", "1024"],
            "--kv-tokens is a llama.cpp engine setting and the model runs on torch, where it would do nothing",
        ),
        (
            ["--engine", "torch", "--prefill-threads", "1"],
            "--prefill-threads is a llama.cpp engine setting and the model runs on torch",
        ),
        (
            ["--model", "a=default", "--model", "b=default", "--engine", "torch", "--kv-tokens", "1024"],
            "--kv-tokens is a llama.cpp engine setting and every model here runs on torch",
        ),
        (
            ["--engine", "torch", "--cache-ram", "0"],
            "--cache-ram is a llama.cpp engine setting and the model runs on torch, where it would do nothing",
        ),
        (
            ["--engine", "torch", "--spec-type", "ngram"],
            "--spec-type is a llama.cpp engine setting and the model runs on torch, where it would do nothing",
        ),
        (
            ["--engine", "vllm", "--spec-draft-n-max", "8"],
            "--spec-draft-n-max is a llama.cpp engine setting and the model runs on vllm, where it would do nothing",
        ),
        (
            ["--spec-type", "none", "--spec-draft-n-max", "8"],
            "--spec-draft-n-max sizes speculative drafts, which --spec-type none turns off: drop one",
        ),
    ],
)
def test_flags_that_would_do_nothing_are_refused(arguments, error, capsys):
    assert main(["serve", *arguments]) == 2
    assert _one_error(capsys.readouterr().err).startswith(error)


def test_a_negative_cache_ram_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--cache-ram", "-1"])
    assert exit_.value.code == 2
    assert "argument --cache-ram: must be at least 0 MiB, not -1" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--max-queue", "-1"], "argument --max-queue: must be at least 0, not -1"),
        (["--queue-timeout", "-5"], "argument --queue-timeout: must be a number of seconds of at least 0, not -5"),
        (["--drain-seconds", "-1"], "argument --drain-seconds: must be a number of seconds of at least 0, not -1"),
        (["--drain-seconds", "nan"], "argument --drain-seconds: must be a number of seconds of at least 0, not nan"),
        (["--spec-draft-n-max", "100000"], "argument --spec-draft-n-max: must be at most 256 tokens, not 100000"),
        (["--cache-ram", "100000000"], "argument --cache-ram: must be at most this machine's memory"),
    ],
)
def test_values_out_of_range_are_refused_by_the_parser(arguments, error, capsys):
    """A value that cannot mean anything (a negative queue or wait) or would not fit (a host cache larger than the
    machine's memory, a draft no step can verify) is one line at once, where it was taken silently."""
    with pytest.raises(SystemExit) as exit_:
        main(["serve", *arguments])
    assert exit_.value.code == 2
    assert error in capsys.readouterr().err


def test_a_vllm_option_given_both_as_vllm_arg_and_as_turnkits_flag_is_refused(capsys):
    """One rule for an option a turnkit flag also sets: either way, not both (checked before vLLM is imported)."""
    arguments = ["--engine", "vllm", "--vllm-arg", "max_num_seqs=4", "--max-batch", "8"]
    assert main(["serve", *arguments]) == 2
    assert _one_error(capsys.readouterr().err).startswith(
        "--vllm-arg max_num_seqs=4 and --max-batch 8 set the same vLLM option: give one of them"
    )


def test_llama_cpp_settings_stand_when_one_model_runs_on_llama_cpp(tmp_path, capsys):
    """Beside a torch model, --kv-tokens sizes the llama.cpp one's cache: accepted (the taken port then stops the
    server, after every flag check and before any model is read)."""
    (tmp_path / "models.toml").write_text(
        '[models.gguf]\npath = "default"\n\n[models.torch]\npath = "default"\nengine = "torch"\n'
    )
    with _taken_port() as port:
        arguments = ["--models", str(tmp_path / "models.toml"), "--kv-tokens", "1024", "--prefill-threads", "1"]
        assert main(["serve", *arguments, "--port", str(port)]) == 2
    assert "the port is in use" in _one_error(capsys.readouterr().err)


# -- --template and --family --------------------------------------------------------------------------------------

HASH_TEMPLATE = (
    "{% for message in messages %}### {{ message.role }}\n{{ message.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}### assistant\n{% endif %}"
)


def _prompt(url: str) -> str:
    ids = httpx.post(url + "/tokenize", json={"messages": QUESTION, "add_generation_prompt": True}).json()["tokens"]
    return httpx.post(url + "/detokenize", json={"tokens": ids}).json()["prompt"]


def test_template_serves_the_model_with_that_template(tmp_path):
    template = tmp_path / "hash.jinja"
    template.write_text(HASH_TEMPLATE)
    with turnkit_serve("--template", str(template), "--lazy", "--threads", "1", "--no-ui", name="serve-template") as (
        url,
        _log,
    ):
        assert _prompt(url) == "### user\nWhat is the capital of France?\n### assistant\n"
        (card,) = httpx.get(url + "/v1/models").json()["data"]
        assert card["metadata"]["template"] == str(template.resolve()) and card["metadata"]["family"] is None


def test_family_serves_the_model_with_that_family():
    with turnkit_serve("--family", "plain", "--lazy", "--threads", "1", "--no-ui", name="serve-family") as (url, _log):
        assert _prompt(url) == "user: What is the capital of France?\nassistant:"
        (card,) = httpx.get(url + "/v1/models").json()["data"]
        assert card["metadata"]["family"] == "plain"


def test_template_is_refused_where_it_is_ambiguous(tmp_path, capsys):
    template = tmp_path / "hash.jinja"
    template.write_text(HASH_TEMPLATE)
    assert main(["serve", "--model", "a=default", "--model", "b=default", "--template", str(template)]) == 2
    assert _one_error(capsys.readouterr().err).startswith("--template replaces one model's template; with several")
    assert main(["serve", "--model", "default:plain", "--family", "chatml"]) == 2
    assert _one_error(capsys.readouterr().err) == (
        "--family and the family plain the model 'SmolLM2-135M-Instruct' is given already exclude each other"
    )
    assert main(["serve", "--template", str(tmp_path / "absent.jinja")]) == 2
    assert _one_error(capsys.readouterr().err) == f"--template {tmp_path / 'absent.jinja'} does not exist"


# -- the torch engine's conversion of a GGUF file -------------------------------------------------------------------

BAR = "%|"  # tqdm's bar: "Converting and de-quantizing GGUF tensors...:  21%|██▏  | 58/272"


def _torch_on_gguf(gguf: Path, cache: Path) -> tuple[list[str], dict[str, str]]:
    """``turnkit serve`` on the GGUF with the torch engine, converting it afresh in its own cache folder."""
    command = [*TURNKIT, "serve", "--model", str(gguf), "--engine", "torch", "--threads", "1", "--port", "0", "--no-ui"]
    return command, {**os.environ, "TURNKIT_CACHE": str(cache), "TOKENIZERS_PARALLELISM": "false"}


def test_the_gguf_conversion_draws_no_bars_into_a_log(smollm2_gguf, tmp_path):
    command, env = _torch_on_gguf(smollm2_gguf, tmp_path / "cache")
    log = tmp_path / "serve.log"
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 300
        while "turnkit: serving" not in log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        process.terminate()
        process.wait(timeout=60)
    text = log.read_text()
    assert "turnkit: serving" in text and "converting SmolLM2-135M-Instruct.Q4_1.gguf" in text
    assert BAR not in text and "\r" not in text, text


def test_the_gguf_conversion_keeps_its_bar_on_a_terminal(smollm2_gguf, tmp_path):
    command, env = _torch_on_gguf(smollm2_gguf, tmp_path / "cache")
    child = pexpect.spawn(command[0], command[1:], env=env, encoding="utf-8", timeout=300)
    try:
        child.expect("Converting and de-quantizing GGUF tensors")
        child.expect("turnkit: serving")
    finally:
        child.kill(15)
        child.expect(pexpect.EOF)
