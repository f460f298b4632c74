"""Templates are found and selected exactly as transformers finds and selects them (checked against transformers)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from conversations import WEATHER_TOOL

from turnkit import ChatFormat, TemplateNotFoundError, TurnkitError

DEFAULT = "DEFAULT:{{ bos_token }}{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}{{ eos_token }}"
TOOL_USE = "TOOL_USE:{{ tools | length }}{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}"
OTHER = "OTHER:{% for m in messages %}[{{ m.content }}]{% endfor %}"
MESSAGES = [{"role": "user", "content": "hi"}]


def _folder(tmp_path: Path, base: Path, *, config_template=None, jinja=None, extra=None, config_extra=None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copy(base / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if config_template is not None:
        config["chat_template"] = config_template
    config.update(config_extra or {})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (folder / "chat_template.jinja").write_text(jinja)
    for name, text in (extra or {}).items():
        (folder / "additional_chat_templates").mkdir(exist_ok=True)
        (folder / "additional_chat_templates" / f"{name}.jinja").write_text(text)
    return folder


def _transformers(folder: Path, **kwargs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return tokenizer.apply_chat_template(MESSAGES, tokenize=False, **kwargs)
        except Exception as exc:  # noqa: BLE001
            return exc


def _turnkit(folder: Path, **kwargs):
    try:
        fmt = ChatFormat.from_pretrained(folder)
        if "chat_template" in kwargs:
            kwargs["template_name"] = kwargs.pop("chat_template")
        return fmt.render(MESSAGES, **kwargs)
    except TurnkitError as exc:
        return exc


LAYOUTS = {
    "config string": {"config_template": DEFAULT},
    "jinja file wins over config": {"config_template": OTHER, "jinja": DEFAULT},
    "jinja + additional tool_use": {"jinja": DEFAULT, "extra": {"tool_use": TOOL_USE, "other": OTHER}},
    "additional files replace config": {"config_template": OTHER, "extra": {"default": DEFAULT, "tool_use": TOOL_USE}},
    "legacy list in config": {
        "config_template": [{"name": "default", "template": DEFAULT}, {"name": "tool_use", "template": TOOL_USE}]
    },
    "no default among several": {"extra": {"tool_use": TOOL_USE, "other": OTHER}},
}
CALLS = {
    "plain": {},
    "with tools": {"tools": [WEATHER_TOOL]},
    "named other": {"chat_template": "other"},
    "named tool_use": {"chat_template": "tool_use"},
}


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUTS)
@pytest.mark.parametrize("call", CALLS, ids=CALLS)
def test_template_selection_matches_transformers(tmp_path, smollm2_hf_folder, layout, call):
    folder = _folder(tmp_path, smollm2_hf_folder, **LAYOUTS[layout])
    kwargs = CALLS[call]
    ours = _turnkit(folder, **kwargs)
    theirs = _transformers(folder, **kwargs)
    if isinstance(ours, Exception) or isinstance(theirs, Exception):
        if isinstance(theirs, str) and "chat_template" in kwargs and theirs == kwargs["chat_template"]:
            # transformers renders an unknown *name* as a literal one-line template; turnkit refuses the unknown name
            assert isinstance(ours, TemplateNotFoundError)
            return
        assert isinstance(ours, Exception) and isinstance(theirs, Exception), (ours, theirs)
        return
    assert ours == theirs


def test_special_tokens_come_from_the_config(tmp_path, smollm2_hf_folder):
    folder = _folder(
        tmp_path,
        smollm2_hf_folder,
        jinja=DEFAULT,
        config_extra={"bos_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True}},
    )
    fmt = ChatFormat.from_pretrained(folder)
    assert fmt.bos_token == "<|endoftext|>"
    assert fmt.render(MESSAGES) == _transformers(folder)


def test_legacy_special_tokens_map_is_merged(tmp_path, smollm2_hf_folder):
    folder = _folder(tmp_path, smollm2_hf_folder, jinja=DEFAULT)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("added_tokens_decoder", None)
    config.pop("eos_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    fmt = ChatFormat.from_pretrained(folder)
    assert fmt.eos_token == "<|endoftext|>"
    assert fmt.render(MESSAGES) == _transformers(folder)


def test_gguf_template_and_special_tokens_match_transformers(smollm2_gguf):
    from transformers import AutoTokenizer

    fmt = ChatFormat.from_pretrained(smollm2_gguf)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    assert dict(fmt.special_tokens) == tokenizer.special_tokens_map
    conversations = [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ]
    for messages in conversations:
        for add_generation_prompt in (False, True):
            expected = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert fmt.render(messages, add_generation_prompt=add_generation_prompt) == expected
    assert fmt.templates.metadata["architecture"] == "llama"


def test_hf_folder_saved_from_the_gguf_renders_the_same(smollm2_gguf, smollm2_hf_folder):
    messages = [{"role": "user", "content": "Hello"}]
    from_gguf = ChatFormat.from_pretrained(smollm2_gguf).render(messages, add_generation_prompt=True)
    from_folder = ChatFormat.from_pretrained(smollm2_hf_folder).render(messages, add_generation_prompt=True)
    assert from_gguf == from_folder
    assert from_folder.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_missing_sources_are_clear_errors(tmp_path):
    with pytest.raises(TemplateNotFoundError, match="does not exist"):
        ChatFormat.from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TemplateNotFoundError, match="has no chat template"):
        ChatFormat.from_pretrained(tmp_path / "empty")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    with pytest.raises(TemplateNotFoundError, match="GGUF"):
        ChatFormat.from_pretrained(bogus)
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(TemplateNotFoundError, match="neither"):
        ChatFormat.from_pretrained(other)
