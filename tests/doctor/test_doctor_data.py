"""turnkit doctor --data: shards from turnkit prepare, with and without the end marker, and hand-made broken rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_doctor import clean_model  # noqa: F401 - the shared fixture

from turnkit import ChatFormat, doctor
from turnkit.cli import main

CONVERSATIONS = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And of Italy?"},
            {"role": "assistant", "content": "Rome."},
        ]
    },
    {"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi there!"}]},
]


def _prepare(tmp: Path, model: Path, *extra: str) -> Path:
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    out = tmp / "out"
    assert main(["prepare", str(data), "--model", str(model), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory, clean_model) -> Path:  # noqa: F811
    return _prepare(tmp_path_factory.mktemp("good"), clean_model)


@pytest.fixture(scope="module")
def shards_without_end_marker(tmp_path_factory, clean_model) -> Path:  # noqa: F811
    return _prepare(tmp_path_factory.mktemp("no-end"), clean_model, "--no-end-marker")


def _rows(out: Path) -> list[dict]:
    table = pq.read_table(sorted((out / "shards").glob("*.parquet")))
    return table.select(["input_ids", "labels", "record_id"]).to_pylist()


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_prepared_shards_pass(shards):
    report = doctor.run_data(shards)  # the model comes from the manifest
    assert report.errors == [] and report.warnings == []
    assert {"labels-missing-end-marker", "labels-train-prompt", "labels-empty-reply", "data-tokenizer-mismatch"} <= set(
        report.checks_run
    )
    summary = next(f for f in report.findings if f.check == "data-summary")
    assert "checked 3 examples" in summary.message and "4 trained replies" in summary.message
    assert "3 read back and re-encoded" in summary.message


def test_shards_without_the_end_marker(shards_without_end_marker, clean_model):  # noqa: F811
    report = doctor.run_data(shards_without_end_marker, model=clean_model)
    finding = next(f for f in report.findings if f.check == "labels-missing-end-marker")
    assert finding.severity == "error"
    assert "4 of 4 trained replies in 3 examples" in finding.message and "'<|im_end|>' (id 2)" in finding.message
    assert "--no-end-marker" in finding.fix
    assert "labels-train-prompt" not in report.fired()
    assert main(["doctor", "--data", str(shards_without_end_marker), "--json"]) == 1


def test_labels_that_train_the_user_turn(tmp_path, shards, clean_model):  # noqa: F811
    rows = _rows(shards)
    broken = dict(rows[0])
    ids, labels = np.array(broken["input_ids"]), np.array(broken["labels"])
    pieces = ChatFormat.from_pretrained(clean_model).tokenizer.encode_as_text("What is 2+2?").ids
    start = next(i for i in range(len(ids)) if ids[i : i + len(pieces)].tolist() == pieces)
    labels[start : start + len(pieces)] = ids[start : start + len(pieces)]
    broken["labels"] = labels.tolist()
    data = _write_parquet(tmp_path / "hand.parquet", [broken, *rows[1:]])
    report = doctor.run_data(data, model=clean_model)
    finding = next(f for f in report.findings if f.check == "labels-train-prompt")
    assert "1 of 3 re-encoded examples" in finding.message
    assert f"{len(pieces)} trained token(s) of user text" in finding.message and "What is" in finding.message
    assert "labels-missing-end-marker" not in report.fired()


def test_the_newline_after_the_end_marker_is_tolerated(tmp_path, shards, clean_model):  # noqa: F811
    """TRL's prefix-diff masks train the separator after <|im_end|>: not a prompt token the model learns."""
    rows = []
    for row in _rows(shards):
        labels = np.array(row["labels"])
        ends = np.flatnonzero((labels == 2)[:-1])
        labels[ends + 1] = np.array(row["input_ids"])[ends + 1]
        rows.append({**row, "labels": labels.tolist()})
    report = doctor.run_data(_write_parquet(tmp_path / "trl.parquet", rows), model=clean_model)
    assert report.errors == []


def test_jsonl_rows_with_shifted_labels(tmp_path, shards, clean_model):  # noqa: F811
    lines = []
    for row in _rows(shards):
        labels = [*row["labels"][1:], -100]
        lines.append(json.dumps({"input_ids": row["input_ids"], "labels": labels}))
    data = tmp_path / "rows.jsonl"
    data.write_text("\n".join(lines) + "\n")
    report = doctor.run_data(data, model=clean_model)
    finding = next(f for f in report.findings if f.check == "labels-not-input-ids")
    assert "shifted by one" in finding.message
    assert {s.check: s.why for s in report.not_evaluated}["data-tokenizer-mismatch"].startswith("no turnkit manifest")


def test_data_from_another_tokenizer(tmp_path, shards, clean_model):  # noqa: F811
    copy = tmp_path / "copy"
    (copy / "shards").mkdir(parents=True)
    for shard in (shards / "shards").glob("*.parquet"):
        (copy / "shards" / shard.name).write_bytes(shard.read_bytes())
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["tokenizer_sha256"] = "0" * 64
    (copy / "manifest.json").write_text(json.dumps(manifest))
    report = doctor.run_data(copy, model=clean_model)
    assert [f.check for f in report.warnings] == ["data-tokenizer-mismatch"]


def test_limit_and_bad_data_input(tmp_path, shards, clean_model, capsys):  # noqa: F811
    report = doctor.run_data(shards, limit=1)
    summary = next(f for f in report.findings if f.check == "data-summary")
    assert "checked 1 example (--limit reached)" in summary.message
    (tmp_path / "bad.jsonl").write_text('{"input_ids": [1, 2], "labels": [1, 2]}\n{oops\n')
    assert main(["doctor", "--data", str(tmp_path / "bad.jsonl"), "--model", str(clean_model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"turnkit: error: {tmp_path / 'bad.jsonl'} line 2 is not valid JSON: Expecting property name "
        "enclosed in double quotes"
    ]
    _write_parquet(tmp_path / "nolabels.parquet", [{"input_ids": [1, 2]}])
    assert main(["doctor", "--data", str(tmp_path / "nolabels.parquet"), "--model", str(clean_model)]) == 2
    assert "has no labels column" in capsys.readouterr().err
    (tmp_path / "good.jsonl").write_text('{"input_ids": [1, 2], "labels": [1, 2]}\n')
    assert main(["doctor", "--data", str(tmp_path / "good.jsonl")]) == 2
    assert "pass --model PATH" in capsys.readouterr().err


def test_raw_conversations_are_pointed_to_prepare(tmp_path, capsys, monkeypatch):
    """Conversations where prepared rows belong (JSONL or Parquet) are one line giving the turnkit prepare command;
    that command, run as given, makes data doctor --data audits."""
    monkeypatch.chdir(tmp_path)
    Path("chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    assert main(["doctor", "--data", "chats.jsonl", "--model", "default"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        "turnkit: error: chats.jsonl row 1 is a raw conversation record ('messages'), not prepared data (input_ids "
        "and labels): prepare the conversations first (turnkit prepare chats.jsonl --model default --out DIR), then "
        "audit the result (turnkit doctor --data DIR)"
    )
    assert main(["prepare", "chats.jsonl", "--model", "default", "--out", "prepared"]) == 0
    capsys.readouterr()
    assert main(["doctor", "--data", "prepared"]) == 0
    _write_parquet(Path("chats.parquet"), CONVERSATIONS)
    assert main(["doctor", "--data", "chats.parquet"]) == 2
    assert capsys.readouterr().err.startswith(
        "turnkit: error: chats.parquet holds raw conversation records ('messages'), not prepared data (input_ids "
        "and labels): prepare the conversations first (turnkit prepare chats.parquet --model MODEL --out DIR)"
    )
    Path("other.jsonl").write_text('{"text": "no conversation either"}\n')
    assert main(["doctor", "--data", "other.jsonl", "--model", "default"]) == 2
    assert capsys.readouterr().err.strip() == "turnkit: error: other.jsonl row 1 has no input_ids and labels"


def test_replies_that_hold_only_the_end_marker(tmp_path, capsys):
    """A turn whose tool calls the template leaves out, prepared anyway (--allow-dropped): flagged, exit 1."""
    record = {
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "get_weather", "arguments": {}}}],
            },
        ]
    }
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in [*CONVERSATIONS, record]))
    out = tmp_path / "out"
    assert main(["prepare", str(data), "--model", "default", "--out", str(out), "--allow-dropped"]) == 0
    capsys.readouterr()
    assert main(["doctor", "--data", str(out)]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    assert "labels-empty-reply" in printed
    assert "1 of 5 trained replies in 4 examples hold nothing but the end-of-turn marker '<|im_end|>'" in printed
    assert "first in record data.jsonl:4" in printed


def test_shards_of_conversations_that_open_with_the_assistant_pass_doctor(tmp_path, capsys, smollm2_hf_folder):
    """A bot's greeting first, a greeting alone, a tool result first: prepare trains each reply and its end marker
    only (it had trained the default system prompt and the header before a greeting), so doctor finds no error in
    turnkit's own shards."""
    records = [
        {
            "messages": [
                {"role": "assistant", "content": "Hi! How can I help?"},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
            ]
        },
        {"messages": [{"role": "assistant", "content": "Welcome back."}]},
        {"messages": [{"role": "tool", "content": '{"temperature": 21}'}, {"role": "assistant", "content": "Mild."}]},
    ]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "out"
    assert main(["prepare", str(data), "--model", "default", "--out", str(out)]) == 0
    tokenizer = ChatFormat.from_pretrained(smollm2_hf_folder).tokenizer
    trained = {
        row["record_id"]: tokenizer.decode([label for label in row["labels"] if label != -100]) for row in _rows(out)
    }
    assert sorted(trained.values()) == sorted(
        ["Hi! How can I help?<|im_end|>Blue.<|im_end|>", "Welcome back.<|im_end|>", "Mild.<|im_end|>"]
    )
    capsys.readouterr()
    assert main(["doctor", "--data", str(out)]) == 0, capsys.readouterr().out
