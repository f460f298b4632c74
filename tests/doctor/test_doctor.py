"""turnkit doctor on checkpoints: one broken checkpoint per check id, each firing its check and no unrelated error.

Every checkpoint is built from the embedded model's real tokenizer and configs (the GGUF read by transformers, never a
hub download), copied into a temporary folder and broken in one place.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers
from repo_paths import REPO

from turnkit import doctor
from turnkit.cache import build_folder, cache_dir
from turnkit.cli import main

CHECK_TABLE = REPO / "docs" / "guides" / "doctor.md"
TOOL_TAGS = ("<tool_call>", "</tool_call>")


@pytest.fixture(scope="session")
def clean_model(smollm2_gguf: Path, smollm2_hf_folder: Path) -> Path:
    """SmolLM2 as a Hugging Face folder without weights: tokenizer, template, config.json, generation_config.json."""

    def write(scratch: Path) -> None:
        from transformers import AutoConfig, GenerationConfig

        for item in smollm2_hf_folder.iterdir():
            shutil.copy(item, scratch / item.name)
        config = AutoConfig.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
        config.architectures = ["LlamaForCausalLM"]
        config.save_pretrained(scratch)
        GenerationConfig.from_model_config(config).save_pretrained(scratch)

    return build_folder(cache_dir() / "test-corpus" / "smollm2-doctor-model", write)


@pytest.fixture
def model(tmp_path: Path, clean_model: Path) -> Path:
    """A fresh copy of the clean model, to break."""
    return Path(shutil.copytree(clean_model, tmp_path / "model"))


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data, indent=2))


def _template(folder: Path) -> str:
    return (folder / "chat_template.jinja").read_text()


def _set_template(folder: Path, text: str) -> None:
    (folder / "chat_template.jinja").write_text(text)


def _errors(report: doctor.Report) -> set[str]:
    return {f.check for f in report.errors}


def _only(report: doctor.Report, check: str) -> doctor.Finding:
    """The one finding of ``check``, after asserting no other check reports an error."""
    found = [f for f in report.findings if f.check == check]
    assert found, f"{check} did not fire: {report.to_dict()}"
    assert _errors(report) <= {check}, report.to_dict()
    return found[0]


def _skipped(report: doctor.Report) -> dict[str, str]:
    return {s.check: s.why for s in report.not_evaluated}


# -- the clean model ------------------------------------------------------------------------------------------------


def test_the_clean_folder_has_no_error_and_runs_every_check(model):
    report = doctor.run(model)
    assert report.errors == []
    assert report.fired() <= {"pad-is-end-marker", "forgeable-tokenizer", "tools-ignored"}
    for check in (
        "template-missing",
        "no-generation-prompt",
        "marker-not-single-token",
        "eos-not-end-marker",
        "generation-config-eos",
        "double-bos",
        "vocab-exceeds-model",
        "non-special-marker",
        "prefix-unstable",
        "history-rewrite",
        "forgeable-tokenizer",
    ):
        assert check in report.checks_run, check
    assert set(_skipped(report)) == {"template-drift", "adapter-missing-modules-to-save", "adapter-base-unavailable"}
    assert report.exit_code() == 0


def test_the_embedded_gguf_has_no_error(smollm2_gguf):
    report = doctor.run("default")
    assert report.errors == []
    assert report.kind == "GGUF file"
    assert {"eos-not-end-marker", "double-bos", "vocab-exceeds-model", "marker-not-single-token"} <= set(
        report.checks_run
    )
    # its file lies in the cache: the fix names it by its full path, or the command would run from nowhere else
    (pad,) = [finding for finding in report.findings if finding.check == "pad-is-end-marker"]
    assert f"`gguf-new-metadata {smollm2_gguf} fixed.gguf --special-token padding '<|endoftext|>'`" in pad.fix


# -- one broken checkpoint per check ------------------------------------------------------------------------------


def test_template_missing(model):
    (model / "chat_template.jinja").unlink()
    report = doctor.run(model)
    finding = _only(report, "template-missing")
    assert "turnkit add-chatml" in finding.fix
    skipped = _skipped(report)
    assert "no usable chat template" in skipped["eos-not-end-marker"]
    assert "vocab-exceeds-model" in report.checks_run  # the tokenizer is still audited


def test_template_invalid(model):
    _set_template(model, "{% for message in messages %}{{ message.content }}")
    finding = _only(doctor.run(model), "template-invalid")
    assert finding.file == "chat_template.jinja"


def test_template_drift_between_jinja_and_tokenizer_config(model):
    stale = _template(model).replace("named SmolLM", "named OldLM")
    _edit_json(model / "tokenizer_config.json", chat_template=stale)
    report = doctor.run(model)
    finding = _only(report, "template-drift")
    assert finding.severity == "warning"
    assert "line 2" in finding.message and "OldLM" in finding.message
    assert "(.jinja wins)" in finding.message and "convert_hf_to_gguf.py" in finding.message


def test_template_copies_that_agree_are_no_drift(model):
    _edit_json(model / "tokenizer_config.json", chat_template=_template(model))
    report = doctor.run(model)
    assert "template-drift" in report.checks_run and "template-drift" not in report.fired()


def test_template_drift_against_a_gguf_beside_the_folder(model, smollm2_gguf):
    (model / "model.gguf").symlink_to(smollm2_gguf)
    assert "template-drift" not in doctor.run(model).fired()  # the GGUF carries the same template
    _set_template(model, _template(model).replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n\n'"))
    finding = _only(doctor.run(model), "template-drift")
    assert finding.file == "model.gguf"
    assert "add_generation_prompt=True" in finding.message and "what llama.cpp serves" in finding.message


def test_no_generation_prompt(model):
    template = _template(model)
    _set_template(model, template[: template.index("{% if add_generation_prompt %}")])
    finding = _only(doctor.run(model), "no-generation-prompt")
    assert "<|im_start|>assistant" in finding.fix


def test_marker_not_single_token(model):
    _set_template(model, _template(model).replace("<|im_start|>", "<|turn_start|>"))
    finding = _only(doctor.run(model), "marker-not-single-token")
    assert "'<|turn_start|>'" in finding.message and "tokenizer.json" in finding.message


def test_markers_of_any_shape_are_checked(model):
    _set_template(model, _template(model).replace("'<|im_start|>' + message['role']", "'[INST]' + message['role']"))
    report = doctor.run(model)
    assert any("'[INST]'" in f.message for f in report.findings if f.check == "marker-not-single-token")


def test_eos_not_end_marker(model):
    _edit_json(model / "generation_config.json", eos_token_id=[0])
    _edit_json(model / "config.json", eos_token_id=0)
    _edit_json(model / "tokenizer_config.json", eos_token="<|endoftext|>")
    finding = _only(doctor.run(model), "eos-not-end-marker")
    assert "'<|im_end|>' (id 2)" in finding.message and "generation_config.json eos_token_id: [0]" in finding.message
    assert '"eos_token_id": [2, 0]' in finding.fix


def test_generation_config_without_the_end_marker(model):
    _edit_json(model / "generation_config.json", eos_token_id=0)
    report = doctor.run(model)
    finding = _only(report, "generation-config-eos")
    assert finding.severity == "error" and "generate()" in finding.message and "replies run on" in finding.message
    assert report.exit_code() == 1
    assert "eos-not-end-marker" not in report.fired()  # the tokenizer's EOS is the marker


def test_double_bos(model):
    spec = json.loads((model / "tokenizer.json").read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    }
    (model / "tokenizer.json").write_text(json.dumps(spec))
    finding = _only(doctor.run(model), "double-bos")
    assert "[1, 1, ...]" in finding.message and "add_special_tokens=False" in finding.fix


def test_vocab_exceeds_model(model):
    _edit_json(model / "config.json", vocab_size=49150)
    finding = _only(doctor.run(model), "vocab-exceeds-model")
    assert "2 token ids at or above config.json vocab_size 49150" in finding.message
    assert "resize_token_embeddings" in finding.fix


def test_non_special_marker(model):
    """Qwen's case: the template writes <tool_call>, an added token that is not flagged special."""
    tokenizer = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False) for t in TOOL_TAGS])
    tokenizer.save(str(model / "tokenizer.json"))
    _edit_json(model / "config.json", vocab_size=49216)
    calls = (
        "{% for call in message.tool_calls or [] %}"
        "{{ '<tool_call>' + call.function.name + '</tool_call>' }}{% endfor %}"
    )
    template = _template(model).replace("+ '<|im_end|>' + '\n'}}", "}}" + calls + "{{ '<|im_end|>' + '\n' }}")
    _set_template(model, template)
    report = doctor.run(model)
    finding = _only(report, "non-special-marker")
    assert "'<tool_call>' (id 49152)" in finding.message and "split_special_tokens=True" in finding.message
    assert {f.message.split("'")[1] for f in report.findings if f.check == "non-special-marker"} == set(TOOL_TAGS)


def test_pad_is_end_marker(model):
    finding = _only(doctor.run(model), "pad-is-end-marker")
    assert "'<|im_end|>' (id 2)" in finding.message and "<|endoftext|>" in finding.fix
    _edit_json(model / "tokenizer_config.json", pad_token="<|endoftext|>")
    report = doctor.run(model)
    assert "pad-is-end-marker" in report.checks_run and "pad-is-end-marker" not in report.fired()


def test_prefix_unstable(model):
    reasoning = (
        "{% if loop.last and message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    )
    _set_template(
        model, _template(model).replace("'\n' + message['content']", f"'\n' }}}}{reasoning}{{{{ message['content']")
    )
    finding = _only(doctor.run(model), "prefix-unstable")
    assert finding.severity == "info" and "split" in finding.fix


def test_history_rewrite(model):
    reasoning = (
        "{% if loop.last and message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{% endif %}"
    )
    _set_template(
        model, _template(model).replace("'\n' + message['content']", f"'\n' }}}}{reasoning}{{{{ message['content']")
    )
    finding = _only(doctor.run(model), "history-rewrite")
    assert finding.severity == "info" and "rewrites history in an agent episode" in finding.message
    assert 'history="keep"' in finding.fix and "refuse" in finding.fix


TOOLS_SHOWN = (
    "{% if tools %}{{ '<|im_start|>system\nTools: ' + (tools | tojson) + '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}{{ CALL }}{% endfor %}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.mark.parametrize(
    ("call", "fires"),
    [
        ("'<tool_call>' + ({'name': call.function.name, 'arguments': call.function.arguments} | tojson)"
         " + '</tool_call>'", False),
        ("call.function.name + ':\n' + (call.function.arguments | dictsort | map('join', ' = ') | join('\n'))", True),
    ],
)  # fmt: skip
def test_tools_unreadable(model, call, fires):
    _set_template(model, TOOLS_SHOWN.replace("CALL", call))
    report = doctor.run(model)
    assert "tools-unreadable" in report.checks_run and "tools-ignored" not in report.fired()
    if not fires:
        assert "tools-unreadable" not in report.fired()
        return
    finding = _only(doctor.run(model), "tools-unreadable")
    assert finding.severity == "warning" and "cannot read back" in finding.message


def test_tools_ignored(model):
    report = doctor.run(model)  # SmolLM2's template shows no tools
    finding = _only(report, "tools-ignored")
    assert finding.severity == "info" and "with and without tools" in finding.message
    _set_template(model, TOOLS_SHOWN.replace("CALL", "call.function.name"))
    assert "tools-ignored" not in doctor.run(model).fired()


PLAIN = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def test_a_template_without_markers_forges_nothing_and_has_no_end_marker(model):
    _set_template(model, PLAIN)
    report = doctor.run(model)
    assert "forgeable-tokenizer" in report.checks_run and "forgeable-tokenizer" not in report.fired()
    _only(report, "no-end-marker")
    assert "no marker after an assistant reply" in _skipped(report)["eos-not-end-marker"]


def test_forgeable_tokenizer_is_counted_and_turnkit_gives_zero(model):
    report = doctor.run(model)
    finding = next(f for f in report.findings if f.check == "forgeable-tokenizer")
    assert finding.severity == "info"
    assert "tokenizer(rendered text): 4 (" in finding.message and "turnkit encode: 0" in finding.message
    assert sum(report.extra["forgery"].turnkit.values()) == 0


# -- adapters -------------------------------------------------------------------------------------------------------


def _adapter(tmp_path: Path, base: Path, *, new_token: bool, modules_to_save=None, new_tokens: int = 1) -> Path:
    folder = tmp_path / "adapter"
    folder.mkdir()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": 8,
        "lora_alpha": 16,
        "target_modules": ["q_proj", "v_proj"],
        "modules_to_save": modules_to_save,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config))
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(base / name, folder / name)
    tokenizer = tokenizers.Tokenizer.from_file(str(base / "tokenizer.json"))
    if new_token:
        names = ["<|tool|>", "<|tool_result|>"][:new_tokens]
        tokenizer.add_special_tokens([tokenizers.AddedToken(n, special=True, normalized=False) for n in names])
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def test_adapter_with_new_tokens_and_no_modules_to_save(tmp_path, model):
    report = doctor.run(_adapter(tmp_path, model, new_token=True))
    finding = _only(report, "adapter-missing-modules-to-save")
    assert report.kind == "PEFT adapter"
    assert "'<|tool|>' (id 49152)" in finding.message
    assert "model.embed_tokens" in finding.message and "lm_head" in finding.message
    assert "modules_to_save=['embed_tokens', 'lm_head']" in finding.fix
    assert finding.file == "adapter_config.json"


def test_adapter_that_trains_embeddings_and_head(tmp_path, model):
    adapter = _adapter(tmp_path, model, new_token=True, modules_to_save=["embed_tokens", "lm_head"])
    report = doctor.run(adapter)
    assert "adapter-missing-modules-to-save" in report.checks_run
    assert report.errors == []


def test_adapter_without_new_tokens(tmp_path, model):
    report = doctor.run(_adapter(tmp_path, model, new_token=False))
    assert "adapter-missing-modules-to-save" in report.checks_run and report.errors == []


def test_adapter_whose_base_is_not_local(tmp_path, model, capsys):
    """A hub name as base, two tokens beyond config.json's vocab_size, no modules_to_save: the vocabulary is checked
    on what the folder holds (an error), and the adapter check says it could not compare, and how to let it."""
    adapter = _adapter(tmp_path, model, new_token=True, new_tokens=2)
    shutil.copy(model / "config.json", adapter / "config.json")
    _edit_json(adapter / "adapter_config.json", base_model_name_or_path="HuggingFaceTB/SmolLM2-135M")
    assert main(["doctor", str(adapter)]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    assert "vocab-exceeds-model" in printed and "2 token ids at or above config.json vocab_size 49152" in printed
    assert "adapter-base-unavailable" in printed
    assert (
        "cannot compare the adapter with its base: base_model_name_or_path 'HuggingFaceTB/SmolLM2-135M' is not a"
        in (printed)
    )
    assert f"turnkit doctor {adapter} --base PATH (hf download HuggingFaceTB/SmolLM2-135M --local-dir DIR)" in printed
    report = doctor.run(adapter)
    assert {f.check: f.severity for f in report.findings if f.check.startswith("adapter")} == {
        "adapter-base-unavailable": "warning"
    }
    # given its base, the adapter check runs and names the modules to save
    report = doctor.run(adapter, base=model)
    assert _only(report, "adapter-missing-modules-to-save").severity == "error"
    assert "adapter-base-unavailable" in report.checks_run and "adapter-base-unavailable" not in report.fired()
    _edit_json(adapter / "adapter_config.json", modules_to_save=["embed_tokens", "lm_head"])
    assert doctor.run(adapter).errors == []  # the adapter saves the resized embedding: every id has a row


# -- command line: output, exit codes, bad input ----------------------------------------------------------------------


def test_json_shape_and_exit_codes(model, capsys):
    assert main(["doctor", str(model), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) == {"target", "checks_run", "findings", "not_evaluated"}
    assert {tuple(sorted(f)) for f in payload["findings"]} == {("check", "file", "fix", "message", "severity")}
    assert {tuple(sorted(s)) for s in payload["not_evaluated"]} == {("check", "why")}
    assert main(["doctor", str(model), "--strict"]) == 1  # pad-is-end-marker is a warning
    assert main(["doctor", str(model), "--strict", "--ignore", "pad-is-end-marker"]) == 0
    out = capsys.readouterr().out
    assert "pad-is-end-marker: ignored (--ignore)" in out
    _edit_json(model / "generation_config.json", eos_token_id=[0])
    _edit_json(model / "tokenizer_config.json", eos_token="<|endoftext|>")
    assert main(["doctor", str(model)]) == 1


def test_human_output_groups_by_severity(model, capsys):
    main(["doctor", str(model)])
    out = capsys.readouterr().out
    assert out.index("Warnings (1)") < out.index("Info (2)") < out.index("Not evaluated (3)")
    assert re.search(r"^\d+ checks run: 0 errors, 1 warning, 2 info, 3 not evaluated$", out, re.M)


def test_ci_report(model, capsys, monkeypatch):
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    assert main(["doctor", "--ci", str(model)]) == 0
    out = capsys.readouterr().out
    assert "forged-turn test (PASS)" in out and "turnkit encode: 0" in out
    assert out.splitlines()[-1].startswith("PASS: ")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert main(["doctor", "--ci", "--strict", str(model)]) == 1
    out = capsys.readouterr().out
    assert f"::warning title=pad-is-end-marker,file={model}/tokenizer_config.json::" in out
    assert out.splitlines()[-1].startswith("FAIL: ")


def _one_error_line(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("turnkit: error: "), captured.err
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(tmp_path, model, smollm2_gguf, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    assert "has no tokenizer" in _one_error_line(capsys, ["doctor", str(empty)])
    truncated = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as source:
        truncated.write_bytes(source.read(3_000_000))
    assert "truncated or corrupt" in _one_error_line(capsys, ["doctor", str(truncated)])
    (model / "generation_config.json").write_text('{"eos_token_id": [2,')
    line = _one_error_line(capsys, ["doctor", str(model)])
    assert "generation_config.json is not valid JSON" in line and "line 1 column" in line
    assert "does not exist" in _one_error_line(capsys, ["doctor", str(tmp_path / "nowhere")])
    assert "unknown check id no-such-check" in _one_error_line(
        capsys, ["doctor", str(model), "--ignore", "no-such-check"]
    )


def test_the_docs_check_table_has_every_check():
    text = CHECK_TABLE.read_text()
    for check in doctor.CHECKS:
        assert f"| `{check}` |" in text, check


# -- GGUF files: a small copy of the embedded model's header, broken in one place ------------------------------------


def _gguf_variant(source: Path, target: Path, *, rows: int | None = None, **changes: float | bool) -> Path:
    """A GGUF with the embedded model's metadata (``changes`` applied) and one small ``token_embd`` tensor."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(target, arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name == "general.architecture" or name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, changes.pop(name, field.contents()), kind, sub_type=sub_type)
    for name, value in changes.items():
        kind = {bool: gguf.GGUFValueType.BOOL, float: gguf.GGUFValueType.FLOAT32}.get(type(value))
        writer.add_key_value(name, value, kind or gguf.GGUFValueType.UINT32)
    count = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer.add_tensor("token_embd.weight", np.zeros((rows or count, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def test_a_broken_gguf_file(tmp_path, monkeypatch, smollm2_gguf):
    """Three GGUF-only breakages in one file (each GGUF costs seconds to convert): each named in its own finding."""
    monkeypatch.setenv("TURNKIT_CACHE", str(tmp_path / "cache"))  # conversions of throwaway files stay out of the cache
    changes = {"tokenizer.ggml.eos_token_id": 0, "tokenizer.ggml.add_bos_token": True}
    path = _gguf_variant(smollm2_gguf, tmp_path / "variant.gguf", rows=49000, **changes)
    report = doctor.run(path)
    assert _errors(report) == {"eos-not-end-marker", "vocab-exceeds-model"}
    found = {f.check: f for f in report.findings}
    assert "--special-token eot '<|im_end|>'" in found["eos-not-end-marker"].fix
    assert "variant.gguf eos/eot/eom: [0]" in found["eos-not-end-marker"].message
    assert "tokenizer.ggml.add_bos_token" in found["double-bos"].message
    assert "token_embd has 49000 rows" in found["vocab-exceeds-model"].message
    assert {f.file for f in report.findings if f.file} == {"variant.gguf"}


def test_gguf_fixes_are_commands_that_run_from_anywhere(tmp_path, monkeypatch, smollm2_gguf):
    """Each gguf-new-metadata fix, run as printed from another folder, writes a GGUF its finding no longer fires on:
    the file is named by its full path although doctor was given a relative one, and each flag is one the tool
    knows (it ignores an unknown token name with a warning and writes an unchanged copy)."""
    monkeypatch.setenv("TURNKIT_CACHE", str(tmp_path / "cache"))  # conversions of throwaway files stay out of the cache
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model").mkdir()
    _gguf_variant(smollm2_gguf, Path("model") / "variant.gguf", **{"tokenizer.ggml.eos_token_id": 0})
    found = {finding.check: finding for finding in doctor.run("model/variant.gguf").findings}
    for check in ("eos-not-end-marker", "pad-is-end-marker"):
        match = re.search(r"`(gguf-new-metadata [^`]+)`", found[check].fix)
        assert match is not None, found[check].fix
        command = shlex.split(match.group(1))
        assert command[1:3] == [str(Path.cwd() / "model" / "variant.gguf"), "fixed.gguf"]
        elsewhere = tmp_path / check
        elsewhere.mkdir()
        tool = str(Path(sys.executable).parent / command[0])
        subprocess.run([tool, *command[1:]], cwd=elsewhere, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        assert check not in doctor.run(elsewhere / "fixed.gguf").fired(), check
