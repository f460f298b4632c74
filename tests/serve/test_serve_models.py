"""Several models behind one server: model specs (``--model``, ``--models DIR``, models files), selection by name, a
template override per model, lazy loading and least-recently-used unloading, and what ``/health`` and ``/v1/models``
say. The server runs as ``turnkit serve`` on the real embedded SmolLM2, served twice under two names (one with the
``plain`` family's template), with the official openai client."""

from __future__ import annotations

import json
import shutil

import httpx
import openai
import pytest
from serve_harness import turnkit_serve
from test_doctor import _gguf_variant

from turnkit.errors import ServeConfigError
from turnkit.serve import modelspec
from turnkit.serve.models import ModelRegistry
from turnkit.serve.sampling import EMBEDDED_DEFAULTS, SamplingDefaults, read_generation_config

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

MODELS_TOML = """
[models.smol]
path = "default"

[models.smol-plain]
path = "default"
family = "plain"
temperature = 0.0
"""


# -- specs --------------------------------------------------------------------------------------------------------


def test_model_arguments(tmp_path):
    weights = tmp_path / "tiny.gguf"
    weights.write_bytes(b"GGUF")
    assert modelspec.from_argument("default") == modelspec.ModelSpec("SmolLM2-135M-Instruct", "default")
    assert modelspec.from_argument(str(weights)).name == "tiny"
    spec = modelspec.from_argument(f"mine={weights}:chatml")
    assert (spec.name, spec.path, spec.family) == ("mine", str(weights), "chatml")
    assert modelspec.from_argument("small=default").name == "small"
    with pytest.raises(ServeConfigError, match="unknown family 'nope'"):
        modelspec.from_argument(f"x={weights}:nope")
    with pytest.raises(ServeConfigError, match="two models are named 'a'"):
        modelspec.unique([modelspec.from_argument("a=default"), modelspec.from_argument(f"a={weights}")])


def test_models_directory(tmp_path):
    (tmp_path / "one.gguf").write_bytes(b"GGUF")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "readme.txt").write_text("")
    assert [s.name for s in modelspec.from_directory(tmp_path)] == ["hf", "one"]
    with pytest.raises(ServeConfigError, match=r"no \.gguf file"):
        modelspec.from_directory(tmp_path / "notes")


def test_models_files(tmp_path):
    toml = tmp_path / "models.toml"
    toml.write_text(MODELS_TOML + '\n[models.local]\npath = "weights/x.gguf"\ntemplate = "t.jinja"\n')
    specs = modelspec.from_file(toml)
    assert [s.name for s in specs] == ["smol", "smol-plain", "local"]
    assert specs[1].family == "plain" and specs[1].sampling == {"temperature": 0.0}
    assert specs[2].path == str(tmp_path / "weights/x.gguf") and specs[2].template == str(tmp_path / "t.jinja")
    listed = tmp_path / "models.json"
    listed.write_text(json.dumps({"models": [{"name": "a", "path": "default", "top_p": 0.5, "context": 32768}]}))
    assert modelspec.from_file(listed)[0].sampling == {"top_p": 0.5}
    assert modelspec.from_file(listed)[0].context == 32768 and specs[0].context is None
    for bad, needle in [
        ({"models": {"a": {"path": "default", "colour": 1}}}, "unknown key 'colour'"),
        ({"models": {"a": {"family": "chatml"}}}, "has no path"),
        ({"models": {"a": {"path": "default", "temperature": "hot"}}}, "temperature must be a number"),
        ({"models": {"a": {"path": "default", "family": "chatml", "template": "t"}}}, "not both"),
        ({"nothing": 1}, "needs a 'models' table"),
        ({"models": {"a": {"path": "default", "context": "long"}}}, "context must be a whole number"),
    ]:
        listed.write_text(json.dumps(bad))
        with pytest.raises(ServeConfigError, match=needle):
            modelspec.from_file(listed)
    listed.write_text("{oops")
    with pytest.raises(ServeConfigError, match="not valid json"):
        modelspec.from_file(listed)


def test_generation_config_defaults(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    values = read_generation_config(tmp_path)
    assert SamplingDefaults().updated(values) == SamplingDefaults(temperature=0.6, top_p=0.95, top_k=20)
    (tmp_path / "generation_config.json").write_text(json.dumps({"do_sample": False, "temperature": 0.6}))
    assert read_generation_config(tmp_path)["temperature"] == 0.0
    assert read_generation_config(tmp_path / "missing") == {}


def test_sampling_defaults_follow_the_model_not_the_path(tmp_path, smollm2_gguf):
    """The embedded model's file under another name and path is still the embedded model (by its sha256): its model
    card's values, not 1.0 / 1.0; a GGUF that recommends sampling (``general.sampling.*``) gets what it recommends."""
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(smollm2_gguf, renamed)
    recommends = {"general.sampling.temp": 0.7, "general.sampling.top_p": 0.8, "general.sampling.top_k": 20}
    tuned = _gguf_variant(smollm2_gguf, tmp_path / "tuned.gguf", **recommends)
    arguments = ("--model", f"smol={renamed}", "--model", f"tuned={tuned}", "--lazy", "--no-ui", "--threads", "1")
    with turnkit_serve(*arguments, name="serve-sampling") as (url, _log):
        models = httpx.get(url + "/v1/models").json()["data"]
    defaults = {m["id"]: m["metadata"]["sampling_defaults"] for m in models}
    assert defaults["smol"] == EMBEDDED_DEFAULTS.to_dict()
    assert defaults["tuned"] == pytest.approx(
        {**SamplingDefaults().to_dict(), "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    )


def test_loading_a_model_builds_what_the_first_reply_would_wait_for(smollm2_gguf):
    """The tokenizer's byte table (the stream parser's) and the encoder's data tokenizer are built when the model
    loads, not while the first client waits for its first token (about 0.2 s of it on this model before)."""
    registry = ModelRegistry([modelspec.from_argument(f"smol={smollm2_gguf}")], load=lambda spec, path: object())
    tokenizer = registry.format("smol").tokenizer
    assert "byte_table" not in vars(tokenizer) and "_fast" not in vars(tokenizer)
    registry.preload("smol")
    assert vars(tokenizer)["byte_table"] is not None and "_fast" in vars(tokenizer)


def test_the_command_line_refuses_bad_model_arguments(tmp_path):
    from turnkit.cli import main

    assert main(["serve", "--model", str(tmp_path / "absent.gguf")]) == 2
    assert main(["serve", "--model", "a=default", "--model", "b=default", "--model-id", "x"]) == 2
    assert main(["serve", "--models", str(tmp_path)]) == 2  # an empty folder
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    (tmp_path / "models.toml").write_text(f'[models.x]\npath = "default"\ntemplate = "{broken}"\n')
    assert main(["serve", "--models", str(tmp_path / "models.toml"), "--lazy"]) == 2  # read at start, not a 503 later


# -- a server of two models -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    (folder / "models.toml").write_text(MODELS_TOML)
    with turnkit_serve(
        "--models",
        str(folder / "models.toml"),
        "--threads",
        "1",
        "--max-loaded",
        "1",
        "--lazy",
        "--no-ui",
        name="serve-models",
    ) as (url, _log):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=120)


def _health(server: str) -> dict:
    return httpx.get(server + "/health").json()


def test_lazy_load_select_by_name_and_unload(client, server):
    # nothing is loaded until a model generates; listing and tokenizing need no weights
    assert _health(server)["loaded"] == []
    listed = {m.id: m for m in client.models.list().data}
    assert list(listed) == ["smol", "smol-plain"]
    assert listed["smol"].model_extra["metadata"]["sampling_defaults"] == EMBEDDED_DEFAULTS.to_dict()
    plain_defaults = listed["smol-plain"].model_extra["metadata"]["sampling_defaults"]
    assert plain_defaults["temperature"] == 0.0 and plain_defaults["top_p"] == EMBEDDED_DEFAULTS.top_p
    assert listed["smol-plain"].model_extra["metadata"]["family"] == "plain"

    # each model renders with its own template
    chatml = httpx.post(server + "/tokenize", json={"model": "smol", "messages": QUESTION}).json()
    plain = httpx.post(server + "/tokenize", json={"model": "smol-plain", "messages": QUESTION}).json()
    text = httpx.post(server + "/detokenize", json={"model": "smol-plain", "tokens": plain["tokens"]}).json()
    assert text["prompt"] == "user: What is the capital of France?\nassistant:"
    assert chatml["tokens"] != plain["tokens"]
    assert _health(server)["loaded"] == []

    # the first request loads its model; the prompt is that model's
    first = client.chat.completions.create(model="smol", messages=QUESTION, temperature=0, max_tokens=8)
    assert first.model == "smol" and first.usage.prompt_tokens == chatml["count"]
    assert _health(server)["loaded"] == ["smol"]
    # --max-loaded 1: the other model's first request unloads the least recently used
    second = client.chat.completions.create(model="smol-plain", messages=QUESTION, max_tokens=8)
    assert second.model == "smol-plain" and second.usage.prompt_tokens == plain["count"]
    health = _health(server)
    assert health["loaded"] == ["smol-plain"] and health["max_loaded"] == 1
    assert {m["id"]: m["loaded"] for m in health["models"]} == {"smol": False, "smol-plain": True}
    # a loaded model's engine: the request fields it honours and the options it takes, from their declarations
    assert health["models"][1]["engine"] == {
        "engine": "llama.cpp",
        "honours": [
            *("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"),
            *("logit_bias", "stop_token_ids", "response_format", "prompt_logprobs"),
        ],
        "options": [
            *("--threads", "--prefill-threads", "--context", "--kv-tokens", "--cache-ram", "--spec-type"),
            *("--spec-draft-n-max", "--max-batch"),
        ],
    }
    assert "engine" not in health["models"][0]
    # ``default`` names the embedded model (the first one here), which loads again
    again = client.chat.completions.create(model="default", messages=QUESTION, temperature=0, max_tokens=8)
    assert again.model == "smol" and again.choices[0].message.content == first.choices[0].message.content
    assert _health(server)["loaded"] == ["smol"]


def test_unknown_model_lists_the_served_ones(client):
    with pytest.raises(openai.NotFoundError, match="'smol', 'smol-plain'"):
        client.chat.completions.create(model="gpt-9", messages=QUESTION)
