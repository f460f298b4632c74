"""Sampling defaults and fields, on ``turnkit serve`` with the real embedded SmolLM2 and the official openai client.

Each field is shown to do what it says: a field left out gets the model's default (temperature 0.2, top_p 0.9 for
the embedded model), ``n`` gives that many choices, each penalty changes greedy output on a repetitive prompt,
``logit_bias`` bans and forces tokens, ``top_k=1`` and ``min_p=1`` are greedy; unsupported fields are 400s naming them.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from serve_harness import turnkit_serve

QUESTION = [{"role": "user", "content": "Say hello in Spanish."}]
REPEAT = "the the the the the the the the"
MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with turnkit_serve("--threads", "1", "--no-ui", "--engine", "torch", name="serve-sampling") as (url, _log):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(client, prompt=REPEAT, max_tokens=10, **fields):
    extra = {k: fields.pop(k) for k in ("top_k", "min_p", "repetition_penalty") if k in fields}
    response = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=max_tokens, extra_body=extra or None, **fields
    )
    return response


def _text(client, **fields) -> str:
    return _complete(client, **fields).choices[0].text


def test_defaults_are_the_model_cards(client):
    (model,) = client.models.list().data
    assert model.model_extra["metadata"]["sampling_defaults"]["temperature"] == 0.2
    assert model.model_extra["metadata"]["sampling_defaults"]["top_p"] == 0.9
    # a request that omits temperature and top_p samples exactly as one that sends the defaults
    omitted = [_text(client, prompt="Once upon a time", seed=seed) for seed in (1, 2, 3)]
    sent = [_text(client, prompt="Once upon a time", seed=seed, temperature=0.2, top_p=0.9) for seed in (1, 2, 3)]
    hot = [_text(client, prompt="Once upon a time", seed=seed, temperature=2.0, top_p=1.0) for seed in (1, 2, 3)]
    assert omitted == sent
    assert omitted != hot  # and a value sent overrides the default


def test_the_seed_example_makes_sense_with_defaults(client):
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, seed=7)
    assert "hola" in reply.choices[0].message.content.lower()


def test_n_gives_that_many_choices(client):
    response = client.chat.completions.create(
        model=MODEL, messages=QUESTION, n=3, max_tokens=6, temperature=1.5, seed=3
    )
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert len({c.message.content for c in response.choices}) > 1
    assert response.usage.completion_tokens <= 18
    stream = client.chat.completions.create(
        model=MODEL,
        messages=QUESTION,
        n=2,
        max_tokens=6,
        temperature=1.5,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finishes, usage = {0: "", 1: ""}, {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert texts == {i: response.choices[i].message.content for i in (0, 1)}  # seed + index per choice
    assert set(finishes) == {0, 1} and all(finishes.values())
    assert usage.completion_tokens <= 12 and usage.prompt_tokens == response.usage.prompt_tokens
    completions = _complete(client, n=2, temperature=1.0, seed=5)
    assert [c.index for c in completions.choices] == [0, 1]


@pytest.mark.parametrize(
    "field",
    [{"presence_penalty": 2.0}, {"frequency_penalty": 2.0}, {"repetition_penalty": 2.0}],
    ids=lambda f: next(iter(f)),
)
def test_penalties_change_greedy_output(client, field):
    greedy = _text(client, temperature=0)  # "-the-future-of-the-world-in": "the" again and again
    assert _text(client, temperature=0, **{k: 1.0 if k == "repetition_penalty" else 0.0 for k in field}) == greedy
    penalised = _text(client, temperature=0, **field)
    assert penalised != greedy and penalised.count("the") < greedy.count("the")


def test_logit_bias_bans_and_forces(client, server):
    greedy = _complete(client, temperature=0, max_tokens=1, logprobs=0).choices[0]
    first = httpx.post(server + "/tokenize", json={"prompt": greedy.text}).json()["tokens"][0]
    banned = _complete(client, temperature=0, max_tokens=1, logit_bias={str(first): -100}).choices[0].text
    assert banned != greedy.text
    forced_id = httpx.post(server + "/tokenize", json={"prompt": " banana"}).json()["tokens"][0]
    forced = _text(client, temperature=1.0, seed=1, max_tokens=3, logit_bias={str(forced_id): 100})
    assert forced.startswith(" banana")


def test_top_k_and_min_p_cut_the_tail(client):
    greedy = _text(client, prompt="Once upon a time", temperature=0)
    for seed in (1, 2):
        assert _text(client, prompt="Once upon a time", temperature=1.5, seed=seed, top_k=1) == greedy
        assert _text(client, prompt="Once upon a time", temperature=1.5, seed=seed, min_p=1.0) == greedy


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("best_of", 2, "unsupported_parameter"),
        ("suffix", "end", "unsupported_parameter"),
        ("typical_p", 0.5, "unsupported_parameter"),
        ("guided_json", {"type": "object"}, "unsupported_parameter"),
        # chat completions' fields, which the Completions API does not have
        ("functions", [{"name": "f"}], "unknown_parameter"),
        ("modalities", ["text", "audio"], "unknown_parameter"),
    ],
)
def test_unsupported_fields_are_400s_naming_them(server, field, value, code):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: value}
    response = httpx.post(server + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == field and field in error["message"] and error["code"] == code


def test_other_servers_sampling_fields_are_refused_until_a_row_declares_them():
    """The other servers' sampling fields this one refuses are those no request-field row declares: declaring one
    (``typical_p``, ``min_tokens`` ...) lifts its refusal with no edit to the refusals, and none is both."""
    from turnkit.serve.protocol.sampling_fields import _OTHER_SERVERS, SAMPLING_REFUSALS
    from turnkit.serve.request_fields import samplers

    declared = {name for name, _ in samplers()}
    assert "typical_p" in SAMPLING_REFUSALS and not SAMPLING_REFUSALS.keys() & declared
    assert set(_OTHER_SERVERS) - declared == set(SAMPLING_REFUSALS)  # every undeclared one is still refused


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": "lots"}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"n": 0}, "n"),
        ({"logit_bias": {"apple": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"logit_bias": [1]}, "logit_bias"),
    ],
)
def test_bad_sampling_values_are_400s(server, fields, param):
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, **fields}
    response = httpx.post(server + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["param"] == param


def test_fields_an_engine_cannot_honour_are_400s(smollm2_gguf):
    from starlette.testclient import TestClient

    from turnkit import ChatFormat
    from turnkit.serve import ReplayBackend
    from turnkit.serve.app.routes import Server

    fmt = ChatFormat.from_pretrained(smollm2_gguf)
    backend = ReplayBackend(lambda ids: fmt.tokenizer.encode("Hola.<|im_end|>").ids)  # a script ignores sampling
    client = TestClient(Server(fmt, backend, model_id="replay").app())
    base = {"model": "replay", "messages": QUESTION}
    assert client.post("/v1/chat/completions", json=base).json()["choices"][0]["message"]["content"] == "Hola."
    for field, value in [("logit_bias", {"5": 1}), ("presence_penalty", 1.0), ("top_k", 3)]:
        error = client.post("/v1/chat/completions", json={**base, field: value}).json()["error"]
        assert error["param"] == field and "not supported by this model's engine" in error["message"]
    echo = client.post("/v1/completions", json={"model": "replay", "prompt": "x", "echo": True, "logprobs": 1})
    assert echo.status_code == 200  # the replay engine scores prompts (as zeros)
