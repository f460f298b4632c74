"""turnkit.engine_client: a trajectory sampled from an engine's token-id route (issue 46).

* Against a real ``turnkit serve`` (llama.cpp engine, the embedded model; one server for the module): a three-turn
  episode with a tool result and a user turn between the replies, through the client. The ids the server returned are
  the ids the trajectory appended; each turn's prompt, as the server echoes it (``prompt_token_ids``), is the previous
  prompt, the sampled ids and the delta; the log-probabilities are the server's, one per sampled id (the stop's too).
* Errors from the same server: an HTTP error and an answer without ids (a route that does not ask for them). vLLM's
  route, which sends the format's stop ids as ``stop_token_ids``, samples from turnkit serve alike (it takes them).
* llama-server's ``/completion`` (run for real in tests/test_engine_client_llama_server.py where a binary is found)
  and SGLang's ``/generate`` (which does not run on this CPU): their routes checked against answers shaped as their
  servers write them.
"""

from __future__ import annotations

import dataclasses
import math

import httpx
import pytest
from serve_harness import turnkit_serve

from turnkit import ChatFormat
from turnkit.encode.encoding import IGNORE_INDEX
from turnkit.engine_client import LLAMA_SERVER, SGLANG, TURNKIT, VLLM, Answer, EngineClient
from turnkit.errors import EngineReplyError


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    pytest.importorskip("llama_cpp")
    with turnkit_serve(
        "--model", str(smollm2_gguf), "--engine", "llama.cpp", "--threads", "1", "--model-id", "smollm2",
        name="serve-engine-client",
    ) as (url, _log):  # fmt: skip
        yield url


@pytest.fixture(scope="module")
def fmt(smollm2_gguf):
    return ChatFormat.from_pretrained(smollm2_gguf)


def test_a_trajectory_sampled_from_turnkit_serve(server, fmt):
    """Three replies, a tool result and a user turn between them: what the server sampled is what the rows hold."""
    client = EngineClient(server, TURNKIT, stop_ids=fmt.stop_ids, max_tokens=24, temperature=0)
    traj = fmt.trajectory([{"role": "user", "content": "What is the capital of Germany?"}])
    samples, deltas = [], []
    for turn, messages in enumerate(
        [[{"role": "tool", "content": "population: 3.7 million"}], [{"role": "user", "content": "And of France?"}], []]
    ):
        sample = client.sample(traj)
        samples.append(sample)
        choice = sample.response["choices"][0]
        # the ids the server returned are the ids appended, and it was given the trajectory's prompt
        assert sample.ids == choice["token_ids"] and sample.ids
        assert sample.engine_prompt_ids == sample.response["prompt_token_ids"] == sample.prompt_ids
        if turn:
            assert sample.engine_prompt_ids == samples[-2].engine_prompt_ids + samples[-2].ids + deltas[-1]
        # one log-probability per sampled id, the server's, in order: with return_token_ids the stop id has its own
        # (a trainer trains it), as vLLM gives it
        stopped = sample.ids[-1] in fmt.stop_ids
        assert sample.reply.finish_reason == ("stop" if stopped else "length") == choice["finish_reason"]
        lp = choice["logprobs"]
        assert len(sample.logprobs) == len(sample.ids) == len(lp["token_logprobs"])
        assert sample.logprobs == lp["token_logprobs"]
        assert all(math.isfinite(value) and value <= 0 for value in sample.logprobs)
        # aligned: each entry's token is the id at its place, and greedy sampled the likeliest (its top-1)
        for position, (token, value, top) in enumerate(
            zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True)
        ):
            assert token == fmt.tokenizer.decode([sample.ids[position]])
            assert top == {token: value}
        if messages:
            deltas.append(traj.add_messages(messages))
    assert any(sample.reply.finish_reason == "stop" for sample in samples)

    # the row: turn 1's prompt, then each reply and delta; labels on exactly the sampled ids, their logprobs kept
    (row,) = traj.rows
    assert row.input_ids == samples[-1].prompt_ids + samples[-1].ids
    sampled = [position for position, label in enumerate(row.labels) if label != IGNORE_INDEX]
    assert [row.input_ids[p] for p in sampled] == [i for sample in samples for i in sample.ids]
    assert [row.logprobs[p] for p in sampled] == [value for sample in samples for value in sample.logprobs]


def test_the_model_is_asked_once_and_sampling_fields_pass_through(server, fmt):
    client = EngineClient(server, "turnkit", max_tokens=3, temperature=0)
    traj = fmt.trajectory([{"role": "user", "content": "Say hi."}])
    sample = client.sample(traj, max_tokens=2, seed=1)
    assert client.model == "smollm2" and len(sample.ids) <= 2 and sample.response["model"] == "smollm2"


def test_an_http_error_names_the_route_and_leaves_the_trajectory_as_it_was(server, fmt):
    traj = fmt.trajectory([{"role": "user", "content": "Hi"}])
    prompt = traj.prompt_ids
    with pytest.raises(EngineReplyError) as caught:
        EngineClient(server, TURNKIT, model="no-such-model").sample(traj)
    assert caught.value.status == 404 and caught.value.route == "turnkit serve /v1/completions"
    assert "turnkit serve /v1/completions: HTTP 404 from /v1/completions" in str(caught.value)
    assert traj.prompt_ids == prompt  # nothing appended: the next try samples from the same prompt


def test_vllms_route_samples_from_turnkit_serve_too(server, fmt):
    """vLLM's route sends the format's stop ids as ``stop_token_ids``, which turnkit serve takes (issue 46): the reply
    ends at the same ids its own route stops on, and the trajectory takes it."""
    traj = fmt.trajectory([{"role": "user", "content": "Hi"}])
    client = EngineClient(server, VLLM, stop_ids=fmt.stop_ids, model="smollm2", max_tokens=48, temperature=0)
    turn = client.sample(traj)
    assert turn.ids and (turn.ids[-1] in fmt.stop_ids) == (turn.reply.finish_reason == "stop")
    assert traj.rows[0].input_ids == turn.prompt_ids + turn.ids


def test_an_answer_without_ids_is_an_error_naming_the_field(server, fmt):
    """A route that does not ask for ids (an engine without return_token_ids answers the same)."""
    plain = dataclasses.replace(TURNKIT, body=lambda prompt, stop, budget, fields: {"prompt": prompt, **fields})
    traj = fmt.trajectory([{"role": "user", "content": "Hi"}])
    with pytest.raises(EngineReplyError, match=r"no choices\[0\]\.token_ids") as caught:
        EngineClient(server, plain, max_tokens=2).sample(traj)
    assert caught.value.missing == "choices[0].token_ids"
    assert httpx.get(server + "/health").status_code == 200


def test_a_trajectorys_own_stop_ids_are_sent_and_end_the_reply(server, fmt):
    """The trajectory's ``stop_token_ids`` go to turnkit serve in vLLM's field: greedy sampling ends at the first of
    them, where without them it samples on. A route with no field for them (llama-server has none) gets the same
    reply, cut there by the client. Either way the reply reads as stopped and the delta starts with the template's
    <|im_end|>."""
    chat = [{"role": "user", "content": "What is the capital of Germany?"}]
    free = EngineClient(server, TURNKIT, max_tokens=24, temperature=0).sample(fmt.trajectory(chat))
    stop = free.ids[2]
    end = free.ids.index(stop) + 1
    assert end < len(free.ids) and stop not in fmt.stop_ids
    unaware = dataclasses.replace(
        TURNKIT,
        body=lambda prompt, stops, budget, fields: {
            "prompt": prompt, "max_tokens": budget, "logprobs": 1, "return_token_ids": True, **fields
        },
    )  # fmt: skip
    for route in (TURNKIT, unaware):
        traj = fmt.trajectory(chat, stop_token_ids=[stop])
        sample = EngineClient(server, route, max_tokens=24, temperature=0).sample(traj)
        assert sample.ids == free.ids[:end] and sample.logprobs == pytest.approx(free.logprobs[:end], abs=1e-3)
        assert sample.finish_reason == "stop" and traj.finish_reasons == ["stop"]
        served = sample.response["choices"][0]["token_ids"]
        assert served == (sample.ids if route is TURNKIT else free.ids)  # the server stopped, or sampled on
        delta = traj.add_messages([{"role": "user", "content": "And of France?"}])
        assert fmt.tokenizer.decode(delta[:1]) == "<|im_end|>"


# -- llama-server and SGLang: their answers' shapes --------------------------------------------------------------------


def test_llama_server_route_shape():
    body = LLAMA_SERVER.body([1, 2, 3], [2], 16, {"temperature": 0.7})
    assert body == {"prompt": [1, 2, 3], "n_predict": 16, "return_tokens": True, "n_probs": 1, "temperature": 0.7}
    answer = {
        "content": "Hi",
        "tokens": [17, 2],
        "stop_type": "eos",
        "completion_probabilities": [{"id": 17, "token": "Hi", "logprob": -0.5, "top_logprobs": []}],
    }
    assert LLAMA_SERVER.read(LLAMA_SERVER.name, answer) == Answer([17, 2], [(17, -0.5)], None, "eos")
    with pytest.raises(EngineReplyError, match="no tokens") as caught:
        LLAMA_SERVER.read(LLAMA_SERVER.name, {"content": "Hi", "tokens": None})
    assert caught.value.missing == "tokens"


def test_sglang_route_shape():
    body = SGLANG.body([1, 2, 3], [2], 16, {"temperature": 0.7})
    assert body == {
        "input_ids": [1, 2, 3],
        "sampling_params": {"max_new_tokens": 16, "temperature": 0.7, "stop_token_ids": [2]},
        "return_logprob": True,
    }
    meta = {
        "finish_reason": {"type": "stop", "matched": 2},
        "output_token_logprobs": [[-0.5, 17, None], [-0.1, 2, None]],
    }
    # a matched stop id left out of output_ids is the turn's end: it is appended
    assert SGLANG.read(SGLANG.name, {"output_ids": [17], "meta_info": meta}) == Answer(
        [17, 2], [(17, -0.5), (2, -0.1)], None, "stop"
    )


def test_misaligned_logprobs_are_refused():
    """An entry naming another id than the one at its place, or a count off by more than the stop's, is an error."""
    from turnkit.engine_client import _aligned

    first, stop = _aligned("r", Answer([5, 6], [(5, -1.0)]))  # no entry for the stop: nan, as the rows write it
    assert first == -1.0 and math.isnan(stop)
    with pytest.raises(EngineReplyError, match="is for id 6, the id sampled there is 5"):
        _aligned("r", Answer([5, 6], [(6, -1.0)]))
    with pytest.raises(EngineReplyError, match="1 log-probabilities for 3 sampled ids"):
        _aligned("r", Answer([5, 6, 7], [(5, -1.0)]))


def test_a_server_that_cannot_be_reached_names_the_route(fmt):
    traj = fmt.trajectory([{"role": "user", "content": "Hi"}])
    with pytest.raises(EngineReplyError, match=r"^SGLang /generate: http://127\.0\.0\.1:1/generate could not be"):
        EngineClient("http://127.0.0.1:1", "sglang", timeout=5).sample(traj)
