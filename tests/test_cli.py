from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conversations import WEATHER_TOOL

from turnkit import ChatFormat
from turnkit.cli import main

MESSAGES = [{"role": "system", "content": "Be  brief."}, {"role": "user", "content": "Hi\tthere"}]


@pytest.fixture
def conversation(tmp_path):
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(MESSAGES))
    return path


def test_render_family(conversation, capsys):
    assert main(["render", "--family", "chatml", "--generation-prompt", str(conversation)]) == 0
    assert capsys.readouterr().out == ChatFormat.from_family("chatml").render(MESSAGES, add_generation_prompt=True)


def test_render_model_gguf(conversation, capsys, smollm2_gguf):
    assert main(["render", "--model", str(smollm2_gguf), str(conversation)]) == 0
    assert capsys.readouterr().out == ChatFormat.from_pretrained(smollm2_gguf).render(MESSAGES)


def test_render_template_file_with_tokens_and_vars(tmp_path, conversation, capsys):
    template = tmp_path / "t.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ flag }}")
    assert (
        main(
            ["render", "--template", str(template), "--token", "bos_token=<s>", "--var", "flag=true", str(conversation)]
        )
        == 0
    )
    assert capsys.readouterr().out == "<s>Be  brief.Hi\tthereTrue"


def test_render_tools_file(tmp_path, capsys):
    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps({"messages": [{"role": "user", "content": "Weather?"}]}))
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER_TOOL]))
    assert main(["render", "--family", "qwen2.5", "--tools", str(tools), str(conversation)]) == 0
    assert '"name": "get_weather"' in capsys.readouterr().out


def test_show_makes_whitespace_and_markers_visible(conversation, capsys):
    assert main(["render", "--family", "chatml", "--show", "--generation-prompt", str(conversation)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == ["⟦<|im_start|>⟧system↵", "Be··brief.⟦<|im_end|>⟧↵"]
    assert "Hi→there" in out


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('[{"role": "user<|im_end|>", "content": "x"}]', "message 0, field 'role'"),
        ('[{"role": "user", "content": "x"', "not valid JSON"),
        ('{"nothing": 1}', "must be a JSON list of messages"),
        ("[]", "empty"),
    ],
)
def test_errors_are_one_line_without_traceback(tmp_path, capsys, payload, message):
    path = tmp_path / "bad.json"
    path.write_text(payload)
    assert main(["render", "--family", "chatml", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1


def test_console_script_runs(conversation):
    result = subprocess.run(
        [sys.executable, "-m", "turnkit.cli", "render", "--family", "llama3", str(conversation)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.startswith("<|begin_of_text|><|start_header_id|>system")


def test_encode_table_json_and_prefix_check(tmp_path, capsys, smollm2_gguf):
    conversation = tmp_path / "c.json"
    messages = [
        {"role": "user", "content": "Hi <|im_end|>"},
        {"role": "assistant", "content": "Hello"},
    ]
    conversation.write_text(json.dumps(messages))
    assert main(["encode", "--model", str(smollm2_gguf), str(conversation)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["#", "id", "msg", "source", "trained", "text"]
    assert any(line.split()[3:5] == ["data", "yes"] and "'Hello'" in line for line in table.splitlines())
    assert main(["encode", "--model", str(smollm2_gguf), "--json", str(conversation)]) == 0
    payload = json.loads(capsys.readouterr().out)
    expected = ChatFormat.from_pretrained(smollm2_gguf).encode(messages)
    assert payload["input_ids"] == expected.input_ids.tolist()
    assert payload["control_counts"] == {"<|im_start|>": 3, "<|im_end|>": 3}
    assert "".join(payload["tokens"]) == payload["text"]
    assert main(["encode", "--model", str(smollm2_gguf), "--check-prefix", str(conversation)]) == 0
    assert capsys.readouterr().out.startswith("prefix-stable")


def test_encode_family_with_tokenizer_and_errors(tmp_path, capsys, smollm2_hf_folder):
    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps([{"role": "user", "content": "x"}]))
    assert main(["encode", "--family", "chatml", "--tokenizer", str(smollm2_hf_folder), str(conversation)]) == 2
    assert "no assistant turn" in capsys.readouterr().err
    assert main(["encode", "--family", "chatml", str(conversation)]) == 2
    assert "no tokenizer" in capsys.readouterr().err
