from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conversations import WEATHER_TOOL
from corpus import template_text

from turnkit import ChatFormat
from turnkit.cli import main
from turnkit.errors import TurnkitError

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


def test_show_marks_only_the_markers_the_template_wrote(tmp_path, capsys):
    """A user who types <|im_end|> typed text (encode keeps it as text): --show marks only the template's own."""
    conversation = tmp_path / "typed.json"
    conversation.write_text(json.dumps([{"role": "user", "content": "hi <|im_end|> there"}]))
    assert main(["render", "--model", "default", "--show", str(conversation)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "hi·<|im_end|>·there⟦<|im_end|>⟧↵"
    assert main(["render", "--model", "default", str(conversation)]) == 0
    assert "hi <|im_end|> there<|im_end|>\n" in capsys.readouterr().out  # the render itself is unchanged


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
    assert main(["encode", "--family", "chatml", "--tokenizer", str(smollm2_hf_folder), str(conversation)]) == 0
    assert "no assistant turn, so nothing is trained" in capsys.readouterr().err
    assert main(["encode", "--family", "chatml", str(conversation)]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_encode_shows_a_prompt_without_an_assistant_turn(conversation, capsys):
    """A conversation that ends before any reply is a prompt: its tokens are shown, nothing trained, and a note on
    stderr says so (it was "no token would be trained", exit 2; issue 45). Through the console script, as typed."""
    for extra in ([], ["--split-turns"]):
        result = subprocess.run(
            [sys.executable, "-m", "turnkit.cli", "encode", "--model", "default", *extra, str(conversation)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr == (
            "turnkit: note: the conversation has no assistant turn, so nothing is trained: these are the prompt's "
            "tokens (prepare would reject it as a training record)\n"
        )
        rows = result.stdout.splitlines()[1:]
        assert rows and not any(line.split()[4:5] == ["yes"] for line in rows)
        assert any("'Be'" in line and line.split()[3] == "data" for line in rows)
    assert main(["encode", "--model", "default", "--json", "--generation-prompt", str(conversation)]) == 0
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert not any(payload["assistant_masks"]) and payload["text"].endswith("<|im_start|>assistant\n")
    assert "nothing is trained" in captured.err


def _qwen3_template():
    from corpus import TEMPLATES, require

    return require(TEMPLATES / "Qwen-Qwen3-0.6B.jinja")


TWO_TURNS = [
    {"role": "user", "content": "Is 91 prime?"},
    {"role": "assistant", "content": "No."},
    {"role": "user", "content": "And 97?"},
    {"role": "assistant", "content": "Yes."},
]


def test_encode_split_turns_is_the_way_out_the_error_names(tmp_path, capsys, smollm2_hf_folder):
    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps(TWO_TURNS))
    command = ["encode", "--template", str(_qwen3_template()), "--tokenizer", str(smollm2_hf_folder)]
    command += ["--token", "eos_token=<|im_end|>", str(conversation)]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert "--split-turns" in err and "split_turns=True" not in err and "check_prefix_stable" not in err
    assert err.count("\n") == 1
    assert main([*command, "--split-turns"]) == 0
    out = capsys.readouterr().out
    assert "example 1 of 2: trains message 1\n" in out and "example 2 of 2: trains message 3\n" in out
    assert main([*command, "--split-turns", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all("".join(row["tokens"]) == row["text"] for row in rows)


def test_errors_name_the_flags_not_python_arguments(tmp_path, capsys):
    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps(TWO_TURNS))
    assert main(["encode", "--family", "chatml", str(conversation)]) == 2
    err = capsys.readouterr().err
    assert "--tokenizer" in err and "--template" in err and "--family" in err
    assert "tokenizer=" not in err and "from_template" not in err and "with_tokenizer" not in err
    assert main(["render", "--family", "chatml", "--continue", "--generation-prompt", str(conversation)]) == 2
    assert "--continue and --generation-prompt exclude each other" in capsys.readouterr().err


def test_a_missing_marker_is_one_warning_line(tmp_path, capsys, smollm2_hf_folder):
    from corpus import TEMPLATES, require

    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps(TWO_TURNS))
    template = require(TEMPLATES / "meta-llama-Llama-3.1-8B-Instruct.jinja")
    command = ["encode", "--template", str(template), "--tokenizer", str(smollm2_hf_folder), str(conversation)]
    assert main([*command, "--token", "bos_token=<|begin_of_text|>", "--json"]) == 0
    err = capsys.readouterr().err
    assert "turnkit: warning: the template writes '<|eot_id|>'" in err and "Traceback" not in err


def test_token_takes_name_equals_text(tmp_path, conversation, capsys):
    template = tmp_path / "t.jinja"
    template.write_text("{{ bos_token }}|{{ eos_token }}")
    command = ["render", "--template", str(template), str(conversation)]
    assert main([*command, "--token", "bos_token=1", "--token", 'eos_token="</s>"']) == 0
    assert capsys.readouterr().out == "1|</s>"  # text, never a JSON number; a JSON string literal is unquoted
    with pytest.raises(SystemExit):
        main([*command, "--token", "bos_token"])
    error = capsys.readouterr().err.splitlines()[-1]
    assert "--token: expected NAME=TEXT" in error and "KEY=VALUE" not in error


def _library_errors(smollm2_hf_folder):
    """Each library message the command line rewrites, produced by the library itself."""
    from turnkit.template.sources import TemplateSet

    def no_tokenizer():
        ChatFormat.from_family("chatml").encode(TWO_TURNS)

    def not_prefix_stable():
        from corpus import template_text

        template = template_text("Qwen-Qwen3-0.6B.jinja")
        ChatFormat.from_template(template, tokenizer=smollm2_hf_folder, eos_token="<|im_end|>").encode(TWO_TURNS)

    def several_templates():
        TemplateSet({"a": "x", "b": "y"}, single=False).select()

    def continue_and_prompt():
        ChatFormat.from_family("chatml").render(TWO_TURNS, continue_final_message=True, add_generation_prompt=True)

    def continue_without_content():
        ChatFormat.from_family("chatml").render([*TWO_TURNS, {"role": "assistant"}], continue_final_message=True)

    def dropped_tool_calls():
        template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        ChatFormat.from_template(template, tokenizer=smollm2_hf_folder).encode(TOOL_CALL_TURN)

    def no_template():
        import tempfile

        ChatFormat.from_pretrained(tempfile.mkdtemp())

    return [
        no_tokenizer,
        not_prefix_stable,
        several_templates,
        continue_and_prompt,
        continue_without_content,
        dropped_tool_calls,
        no_template,
    ]


TOOL_CALL_TURN = [
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
    },
]


def test_encode_refuses_a_trained_turn_the_template_leaves_out(tmp_path, capsys):
    """The embedded SmolLM2 template writes no tool calls: an error naming message and field, unless --allow-dropped."""
    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps({"messages": TOOL_CALL_TURN, "tools": [WEATHER_TOOL]}))
    assert main(["encode", "--model", "default", str(conversation)]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("turnkit: error: message 1, field 'tool_calls': the template does not write")
    assert "pass --allow-dropped" in error and "allow_dropped=" not in error
    assert main(["encode", "--model", "default", "--allow-dropped", "--json", str(conversation)]) == 0
    (row,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [t for t, m in zip(row["tokens"], row["assistant_masks"], strict=True) if m] == ["<|im_end|>"]


def _folder_without_template(tmp_path, smollm2_hf_folder):
    """A tokenizer saved alone, as a base model's folder is: no chat_template.jinja, none in tokenizer_config.json."""
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((smollm2_hf_folder / "tokenizer.json").read_bytes())
    config = json.loads((smollm2_hf_folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_a_folder_without_a_template_is_told_the_flags(tmp_path, conversation, capsys, smollm2_hf_folder):
    """The library says ChatFormat.from_template; the command line names --template FILE and --family NAME, and the
    way it names works (issue 45)."""
    folder = _folder_without_template(tmp_path, smollm2_hf_folder)
    for command in (["render", "--model", str(folder)], ["encode", "--model", str(folder)]):
        assert main([*command, str(conversation)]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"turnkit: error: {folder} has no chat template"), error
        assert "pass one with --template FILE or --family NAME" in error and "from_template" not in error
        assert len(error.splitlines()) == 1
    command = ["encode", "--family", "chatml", "--tokenizer", str(folder), "--turns", "none", "--json"]
    assert main([*command, str(conversation)]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"][:2] == ["<|im_start|>", "system"]


def test_every_rewritten_phrase_is_still_the_librarys(smollm2_hf_folder):
    """FLAG_ADVICE matches library messages by their text: a reworded message must fail here, not slip through."""
    from turnkit.cli import FLAG_ADVICE, command_line_message
    from turnkit.tokenizer import TokenizerBinding

    smollm2 = TokenizerBinding.from_folder(smollm2_hf_folder)
    messages = []
    for produce in _library_errors(smollm2):
        with pytest.raises((TurnkitError, ValueError)) as caught:
            produce()
        messages.append(str(caught.value))
    for library, _ in FLAG_ADVICE:
        assert any(library in message for message in messages), f"no library message says {library!r} any more"
    for message in messages:
        rewritten = command_line_message(message)
        assert not re.search(r"\b[a-z]+(_[a-z]+)+=|\(\)", rewritten), rewritten
    assert command_line_message("turns='last' and") == "--turns last and"


def test_a_misspelt_flag_is_named_with_the_nearest_one(conversation, capsys):
    for command, wrong, right in (
        (["render", "--modle", "default"], "--modle", "--model"),
        (["render", "--model", "default", "--shwo"], "--shwo", "--show"),
        (
            ["prepare", "x.jsonl", "--model", "default", "--out", "o", "--max-lenght", "5"],
            "--max-lenght",
            "--max-length",
        ),
    ):
        with pytest.raises(SystemExit) as exit_:
            main([*command, str(conversation)])
        assert exit_.value.code == 2
        assert f"error: unknown flag {wrong} (did you mean {right}?)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["render", "--model", "default", "--zzz", str(conversation)])
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: unknown flag --zzz")


def test_a_hub_name_is_told_to_download_first(conversation, capsys):
    assert main(["render", "--model", "Qwen/Qwen2.5-7B-Instruct", str(conversation)]) == 2
    err = capsys.readouterr().err
    assert "--model Qwen/Qwen2.5-7B-Instruct does not exist" in err
    assert "not from the hub: download it first (hf download Qwen/Qwen2.5-7B-Instruct --local-dir DIR)" in err
    assert main(["generate", "--model", "Qwen/Qwen2.5-7B-Instruct", "--prompt", "hi"]) == 2
    assert "hf download Qwen/Qwen2.5-7B-Instruct" in capsys.readouterr().err
    assert main(["doctor", "Qwen/Qwen2.5-7B-Instruct"]) == 2
    assert capsys.readouterr().err == (
        "turnkit: error: Qwen/Qwen2.5-7B-Instruct does not exist; turnkit reads checkpoints from disk, not from the "
        "hub: download it first (hf download Qwen/Qwen2.5-7B-Instruct --local-dir DIR) and give DIR\n"
    )
    assert main(["doctor", "--data", "prepared", "--model", "Qwen/Qwen2.5-7B-Instruct"]) == 2
    assert "error: --model Qwen/Qwen2.5-7B-Instruct does not exist" in capsys.readouterr().err


def test_a_message_without_content_names_the_field(tmp_path, capsys):
    conversation = tmp_path / "c.json"
    conversation.write_text(json.dumps([{"role": "user"}]))
    assert main(["render", "--model", "default", str(conversation)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("turnkit: error: message 0, field 'content': missing, and the chat template reads it")
    assert "dict object" not in err


def test_serve_help_gives_host_and_port_their_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--host ADDRESS the address to listen on (default 127.0.0.1" in help_text
    assert "--port N the port to listen on (default 8000)" in help_text


def test_serve_names_what_a_tokenizer_only_folder_lacks(tmp_path, capsys, smollm2_hf_folder):
    import shutil

    folder = tmp_path / "tokenizer-only"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(smollm2_hf_folder / name, folder / name)
    assert main(["serve", "--model", str(folder)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert f"turnkit: error: {folder} holds no model to serve: it has no config.json and no weights" in err
    assert "Unrecognized model" not in err


HERMES_REPLY = (
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
)


def _parse(capsys, *argv: str) -> tuple[int, str]:
    code = main(["parse", *argv])
    return code, capsys.readouterr().out


def test_parse_reads_a_reply_back_and_says_which_format_and_why(tmp_path, capsys):
    reply = tmp_path / "reply.txt"
    reply.write_text(HERMES_REPLY)
    code, out = _parse(capsys, "--family", "qwen2.5", str(reply))
    result = json.loads(out)
    assert code == 0 and result["message"]["content"] == "Let me look."
    (call,) = result["message"]["tool_calls"]
    assert call["status"] == "ok" and call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert result["finish_reason"] == "tool_calls" and result["ended_cleanly"] is True
    assert result["reply_format"] == {"name": "hermes", "why": "declared by the family 'qwen2.5'"}

    # the embedded SmolLM2 writes no tool calls: they come back as text, and the output says why and what to do
    result = json.loads(_parse(capsys, "--model", "default", str(reply))[1])
    assert "tool_calls" not in result["message"] and "<tool_call>" in result["message"]["content"]
    assert result["reply_format"]["name"] == "plain"
    assert result["reply_format"]["why"] == "plain: reads back every probe reply the template writes"
    assert "--reply-format hermes" in result["hint"]

    # markers only named in a comment teach nothing: the template's renders choose
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}{# <tool_call> </tool_call> #}")
    result = json.loads(_parse(capsys, "--template", str(template), str(reply))[1])
    assert result["reply_format"]["name"] == "plain" and "tool_calls" not in result["message"]

    # a template that writes tool calls as hermes does: chosen from its renders of probe calls
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}{% for c in m.tool_calls or [] %}"
        '<tool_call>\n{{ {"name": c.function.name, "arguments": c.function.arguments} | tojson }}\n</tool_call>'
        "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    result = json.loads(_parse(capsys, "--template", str(template), str(reply))[1])
    assert result["reply_format"] == {
        "name": "hermes",
        "why": "hermes: reads back every probe reply the template writes",
    }
    assert result["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_parse_gives_each_call_its_status(tmp_path, capsys):
    reply = tmp_path / "reply.txt"
    reply.write_text(
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><tool_call>{"name": oops</tool_call>'
    )
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([WEATHER_TOOL]))
    result = json.loads(_parse(capsys, "--family", "qwen2.5", "--tools", str(tools), "--length", str(reply))[1])
    unknown, broken = result["message"]["tool_calls"]
    assert unknown["status"] == "unknown_tool" and broken["status"] == "invalid_json"
    assert broken["raw"] == '{"name": oops' and broken["error"]
    assert result["finish_reason"] == "length" and result["ended_cleanly"] is False


def test_parse_streams_ids_in_chunks_to_the_same_message(tmp_path, capsys, smollm2_hf_folder):
    ids = ChatFormat.from_pretrained(smollm2_hf_folder).tokenizer.encode(HERMES_REPLY).ids
    reply = tmp_path / "reply.ids"
    reply.write_text(json.dumps(ids))
    common = ["--family", "qwen2.5", "--tokenizer", str(smollm2_hf_folder), "--ids", str(reply)]
    whole = json.loads(_parse(capsys, *common)[1])
    for size in ("1", "3"):
        code, out = _parse(capsys, *common, "--stream", size)
        lines = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and lines[-1] == whole
        deltas = [line["delta"] for line in lines[:-1]]
        assert "".join(d.get("content", "") for d in deltas) == "Let me look."
        arguments = "".join(c["function"]["arguments"] for d in deltas for c in d.get("tool_calls", []))
        assert arguments == '{"city": "Paris"}'
    # text in chunks of tokens agrees with the whole text too
    text = tmp_path / "reply.txt"
    text.write_text(HERMES_REPLY)
    out = _parse(capsys, "--family", "qwen2.5", "--tokenizer", str(smollm2_hf_folder), "--stream", "2", str(text))[1]
    assert json.loads(out.splitlines()[-1]) == json.loads(_parse(capsys, "--family", "qwen2.5", str(text))[1])
    bad = tmp_path / "bad.ids"
    bad.write_text("1, 2, x")
    assert main(["parse", "--model", "default", "--ids", str(bad)]) == 2
    assert "--ids: " in capsys.readouterr().err


NEMO = "mistralai-Mistral-Nemo-Instruct-2407.jinja"


def test_parse_gives_calls_ids_the_template_takes_back(tmp_path, capsys):
    """Mistral Nemo's template raises unless a call's id is nine characters: calls written without one get numbered
    ids of that shape (they were ``call_0``, ``call_1``), the same whole and streamed, and the message goes back
    through the template with its results."""
    template = tmp_path / "nemo.jinja"
    template.write_text(template_text(NEMO))
    reply = tmp_path / "reply.txt"
    reply.write_text(
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]</s>'
    )
    source = ["--template", str(template), "--token", "bos_token=<s>", "--token", "eos_token=</s>"]
    whole = json.loads(_parse(capsys, *source, str(reply))[1])
    message = whole["message"]
    for call in message["tool_calls"]:
        del call["status"]  # turnkit parse's own field, not a message's
    ids = [call["id"] for call in message["tool_calls"]]
    assert ids == ["call00000", "call00001"]
    streamed = _parse(capsys, *source, "--stream", "5", str(reply))[1].splitlines()[-1]
    assert [call["id"] for call in json.loads(streamed)["message"]["tool_calls"]] == ids
    fmt = ChatFormat.from_template(template_text(NEMO), bos_token="<s>", eos_token="</s>")
    ask = {"role": "user", "content": "Weather in Paris and Oslo?"}
    results = [{"role": "tool", "tool_call_id": call_id, "content": "sunny"} for call_id in ids]
    rendered = fmt.render([ask, message, *results], tools=[WEATHER_TOOL])
    assert all(f'"call_id": "{call_id}"' in rendered for call_id in ids)


# -- issue 34: what a user's second hour met (render, parse, inspect, prepare on the command line) -------------------


def _error_line(capsys, argv: list[str], code: int = 2) -> str:
    """Run the command; it must exit with ``code`` and print one ``turnkit: error:`` line, no traceback."""
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.startswith("turnkit: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("command", "variable", "message"),
    [
        ("render", "tools=5", "--var tools: this command sets tools itself; give tools with --tools FILE"),
        ("render", "messages=3", "the messages come from the conversation file"),
        ("render", "add_generation_prompt=true", "use --generation-prompt"),
        ("render", "continue_final_message=true", "use --continue"),
        ("render", "template_name=tool_use", "use --template-name NAME"),
        ("render", "with_data_spans=true", "--show sets it"),
        ("render", "documents=5", "--var documents must be a JSON list of objects"),
        ("render", 'documents=["a"]', "--var documents must be a JSON list of objects"),
        ("encode", "tools=5", "give tools with --tools FILE"),
        ("encode", "turns=last", "use --turns"),
        ("encode", "split_turns=true", "use --split-turns"),
        ("encode", "allow_dropped=true", "use --allow-dropped"),
        ("encode", "attribution=false", "attribution itself; it is an encode setting, not a template variable"),
        ("encode", "trust_data=true", "trust_data itself"),
        ("encode", "documents=5", "--var documents must be a JSON list of objects"),
        ("inspect", "tools=5", "give tools with --tools FILE"),
        ("inspect", "add_generation_prompt=true", "add_generation_prompt itself; it is an encode setting"),
        ("inspect", "documents=5", "--var documents must be a JSON list of objects"),
    ],
)
def test_a_var_the_command_sets_itself_is_one_error_line(conversation, capsys, command, variable, message):
    source = ["--family", "qwen2.5"] if command == "render" else ["--model", "default"]
    err = _error_line(capsys, [command, *source, "--var", variable, str(conversation)])
    assert message in err


def test_chat_template_kwargs_in_the_conversation_file_are_checked_as_vars(tmp_path, capsys):
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps({"messages": MESSAGES, "chat_template_kwargs": ["enable_thinking"]}))
    err = _error_line(capsys, ["render", "--family", "chatml", str(path)])
    assert f"conversation {path}: chat_template_kwargs must be an object of template variables" in err
    path.write_text(json.dumps({"messages": MESSAGES, "chat_template_kwargs": {"tools": 5}}))
    err = _error_line(capsys, ["encode", "--model", "default", str(path)])
    assert f"chat_template_kwargs.tools in conversation {path}: this command sets tools itself" in err
    # variables a template reads still pass, from the file and from --var (which wins)
    path.write_text(json.dumps({"messages": MESSAGES, "chat_template_kwargs": {"greeting": "file"}}))
    template = tmp_path / "t.jinja"
    template.write_text("{{ greeting }}|{{ documents | map(attribute='title') | join(',') }}")
    assert main(["render", "--template", str(template), str(path)]) == 0
    assert capsys.readouterr().out == "file|"
    documents = json.dumps([{"title": "A", "text": "a"}, {"title": "B", "text": "b"}])
    argv = ["render", "--template", str(template), "--var", "greeting=flag", "--var", f"documents={documents}"]
    assert main([*argv, str(path)]) == 0
    assert capsys.readouterr().out == "flag|A,B"


def test_every_encode_setting_is_refused_as_a_var():
    """A new field of EncodeOptions is refused as a --var without anyone remembering to list it."""
    from dataclasses import fields

    from turnkit.cli import encode as encode_command
    from turnkit.encode import EncodeOptions

    settings = {f.name for f in fields(EncodeOptions)} - {"documents"}
    assert settings <= set(encode_command._SET_BY_FLAGS)


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (0, "is not a GGUF file: it is empty"),
        (3, "is not a readable GGUF file: it is truncated (3 bytes)"),
        (8, "is not a readable GGUF file: it is truncated or corrupt (8 bytes;"),
        (1_000, "is not a readable GGUF file: it is truncated or corrupt (1,000 bytes;"),  # inside a key's value
        (1_785_000, "truncated or corrupt (1,785,000 bytes;"),  # inside the tensor table
        (2_000_000, "truncated or corrupt (2,000,000 bytes;"),  # inside the weights
    ],
)
def test_a_cut_gguf_is_one_error_line_everywhere(tmp_path, capsys, conversation, smollm2_gguf, cut, message):
    path = tmp_path / "cut.gguf"
    with smollm2_gguf.open("rb") as source:
        path.write_bytes(source.read(cut))
    for argv in (
        ["render", "--model", str(path), str(conversation)],
        ["encode", "--family", "chatml", "--tokenizer", str(path), str(conversation)],
        ["parse", "--model", str(path), str(conversation)],
        ["inspect", "--model", str(path), str(conversation)],
        ["doctor", str(path)],
    ):
        assert message in _error_line(capsys, argv), argv


def test_a_file_that_is_not_gguf_says_so(tmp_path, capsys, conversation):
    path = tmp_path / "model.gguf"
    path.write_text("{}")
    err = _error_line(capsys, ["render", "--model", str(path), str(conversation)])
    assert f"{path} is not a GGUF file: it starts with b'{{}}'" in err


def test_parse_ids_outside_the_vocabulary_are_an_error_naming_the_id(tmp_path, capsys):
    """They were dropped, and the reply reported as ending cleanly; the server refuses the same ids."""
    reply = tmp_path / "reply.ids"
    reply.write_text("[19556, 99999999, 2]")
    err = _error_line(capsys, ["parse", "--model", "default", "--ids", str(reply)])
    assert "token id 99999999 (token 2 of the reply) is not in the tokenizer's vocabulary (49,152 tokens)" in err
    err = _error_line(capsys, ["parse", "--model", "default", "--ids", "--stream", "1", str(reply)])
    assert "token id 99999999 (token 2 of the reply)" in err
    reply.write_text("[19556, -3, 2]")
    assert "'-3' is not a token id" in _error_line(capsys, ["parse", "--model", "default", "--ids", str(reply)])
    reply.write_text(" ")
    assert "it is empty" in _error_line(capsys, ["parse", "--model", "default", "--ids", str(reply)])


def test_parse_says_a_reply_that_never_ended_did_not(tmp_path, capsys):
    reply = tmp_path / "reply.txt"
    reply.write_text("Hello, wor")
    assert main(["parse", "--family", "chatml", str(reply)]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert (result["finish_reason"], result["end"], result["ended_cleanly"]) == (None, "none", False)
    assert captured.err == (
        "turnkit: warning: the reply did not end: it holds no end-of-turn marker, EOS id or stop string "
        "(finish_reason null); if the token budget cut it, pass --length\n"
    )
    # cut by its budget, or ended: no warning, and the API's reason
    assert main(["parse", "--family", "chatml", "--length", str(reply)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["finish_reason"] == "length" and captured.err == ""
    reply.write_text("Hello, world<|im_end|>")
    assert main(["parse", "--family", "chatml", str(reply)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["finish_reason"] == "stop" and captured.err == ""


def test_parse_stream_says_when_it_cuts_characters_not_tokens(tmp_path, capsys, smollm2_hf_folder):
    reply = tmp_path / "reply.txt"
    reply.write_text("Hello, world<|im_end|>")
    assert main(["parse", "--family", "chatml", "--stream", "3", str(reply)]) == 0
    captured = capsys.readouterr()
    deltas = [json.loads(line)["delta"]["content"] for line in captured.out.splitlines()[:-1]]
    assert deltas == ["Hel", "lo,", " wo", "rld"]
    assert captured.err == (
        "turnkit: warning: --stream 3 cuts the text in chunks of 3 characters, not tokens: --template and --family "
        "give no tokenizer (add --tokenizer PATH to cut it where the model's tokens end)\n"
    )
    argv = ["parse", "--family", "chatml", "--tokenizer", str(smollm2_hf_folder), "--stream", "1", str(reply)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    deltas = [json.loads(line)["delta"]["content"] for line in captured.out.splitlines()[:-1]]
    assert deltas == ["Hello", ",", " world"] and captured.err == ""
    with pytest.raises(SystemExit):
        main(["parse", "--help"])
    assert "chunks of N characters" in " ".join(capsys.readouterr().out.split())
