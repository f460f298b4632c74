"""turnkit prepare: every input format, every broken record accounted for, crash and resume, Ray = local, TRL."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conversations import WEATHER_TOOL

from turnkit.cli import main
from turnkit.data import FieldMap, PrepareConfig, load_rows, prepare
from turnkit.data.prepare import PrepareError

GOOD = {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}


def _jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory, smollm2_hf_folder):
    """The SmolLM2 tokenizer with a template that refuses a system message after the first turn."""
    folder = tmp_path_factory.mktemp("model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_hf_folder / name, folder / name)
    template = (smollm2_hf_folder / "chat_template.jinja").read_text()
    guard = (
        "{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('System messages must come first') }}{% endif %}{% endfor %}"
    )
    (folder / "chat_template.jinja").write_text(guard + template)
    return str(folder)


def _run(tmp_path: Path, inputs, model: str, **options) -> tuple[dict, list[dict], list[dict]]:
    out = tmp_path / "out"
    config = PrepareConfig(model=model, **options)
    manifest = prepare([str(i) for i in inputs], out, config, shard_records=4, progress=False)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    return manifest, rejects, list(load_rows(out))


def test_broken_records_are_rejected_with_line_and_field(tmp_path, model):
    data = _jsonl(
        tmp_path / "data.jsonl",
        [
            json.dumps(GOOD),
            "{not json",
            json.dumps({"messages": [{"content": "no role"}, {"role": "assistant", "content": "x"}]}),
            json.dumps({"messages": [{"role": "wizard!", "content": "x"}, {"role": "assistant", "content": "y"}]}),
            json.dumps({"messages": []}),
            json.dumps({"messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "y"}]}),
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "a"},
                        {"role": "system", "content": "late"},
                        {"role": "assistant", "content": "b"},
                    ]
                }
            ),
            json.dumps({"conversations": [{"from": "alien", "value": "x"}]}),
            json.dumps({"instruction": "Say hi", "input": ""}),
            json.dumps({"nothing": True}),
            "",
            json.dumps(GOOD),
        ],
    )
    manifest, rejects, rows = _run(tmp_path, [data], model)
    by_line = {r["record_id"].split(":")[-1]: r for r in rejects}
    assert manifest["counts"]["read"] == 11  # the blank line is not a record
    assert manifest["counts"]["written"] == len(rows) == 2
    assert manifest["counts"]["rejected"] == len(rejects) == 9
    assert "line 2 is not valid JSON" in by_line["2"]["reason"] and by_line["2"]["field"] == "line"
    assert by_line["3"]["field"] == "messages[0].role"
    assert by_line["4"]["field"] == "messages[0].role" and "lowercase word" in by_line["4"]["reason"]
    assert "empty" in by_line["5"]["reason"]
    assert by_line["6"]["field"] == "messages[0].content"
    assert by_line["7"]["reason"] == "System messages must come first"
    assert by_line["8"]["field"] == "conversations[0].from"
    assert by_line["9"]["field"] == "output"
    assert "unknown record format" in by_line["10"]["reason"]
    assert sum(manifest["counts"]["rejected_by_reason"].values()) == 9


def test_records_keep_their_ids_and_rejects_are_counted_by_whole_reasons(tmp_path, model):
    sharegpt = {"id": "conv-9", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}
    alien = {"id": "conv-10", "conversations": [{"from": "alien", "value": "x"}]}
    lines = [
        json.dumps({"id": "conv-7", **GOOD}),
        json.dumps({"id": 12, **GOOD}),
        json.dumps(GOOD),
        json.dumps(sharegpt),
        json.dumps(alien),
    ]
    data = _jsonl(tmp_path / "d.jsonl", lines)
    manifest, rejects, rows = _run(tmp_path / "auto", [data], model)
    assert [(r["record_id"], r["source"]) for r in rows] == [
        ("conv-7", "d.jsonl:1"),
        ("12", "d.jsonl:2"),
        ("d.jsonl:3", "d.jsonl:3"),
        ("conv-9", "d.jsonl:4"),
    ]
    assert rejects == [
        {
            "record_id": "conv-10",
            "source": "d.jsonl:5",
            "reason": "unknown speaker 'alien' (known: ['assistant', 'function_call', 'function_response', 'gpt', "
            "'human', 'observation', 'system', 'tool', 'user'])",
            "field": "conversations[0].from",
        }
    ]
    assert manifest["counts"]["rejected_by_reason"] == {"unknown speaker …": 1}
    assert manifest["tokenizer_path"].startswith(("tiktoken", "tokenizers"))
    assert manifest["id_field"].startswith("id (where present")

    # ShareGPT data read as OpenAI: the field is missing, and the reject says so
    manifest, rejects, _ = _run(tmp_path / "openai", [data], model, input_format="openai")
    reasons = {r["record_id"]: r["reason"] for r in rejects}
    assert reasons["conv-9"] == "the record has no messages field for --format openai (it has: conversations, id)"
    assert manifest["counts"]["rejected_by_reason"] == {"the record has no messages field for --format openai": 2}

    # a named id field: records without it are rejected, and say why
    data = _jsonl(tmp_path / "u.jsonl", [json.dumps({"uid": "a1", **GOOD}), json.dumps(GOOD)])
    manifest, rejects, rows = _run(tmp_path / "uid", [data], model, id_field="uid")
    assert [r["record_id"] for r in rows] == ["a1"] and manifest["id_field"] == "uid"
    assert rejects == [
        {
            "record_id": "u.jsonl:2",
            "source": "u.jsonl:2",
            "reason": "the record has no uid field (--id-field)",
            "field": "uid",
        }
    ]


def test_every_input_kind(tmp_path, model):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    records = [
        GOOD,
        {
            "conversations": [
                {"from": "system", "value": "Be brief."},
                {"from": "human", "value": "hi"},
                {"from": "gpt", "value": "hello"},
            ]
        },
        {"instruction": "Add", "input": "2 and 2", "output": "4"},
    ]
    lines = "".join(json.dumps(r) + "\n" for r in records).encode()
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    (tmp_path / "c.json").write_text(json.dumps(records))
    pq.write_table(pa.Table.from_pylist([{"messages": json.dumps(GOOD["messages"])}]), tmp_path / "d.parquet")
    import datasets

    datasets.Dataset.from_list([GOOD]).save_to_disk(str(tmp_path / "e"))
    inputs = ["a.jsonl.gz", "b.jsonl.zst", "c.json", "e"]
    manifest, rejects, rows = _run(tmp_path, [tmp_path / i for i in inputs], model)
    assert manifest["counts"]["read"] == 10 and manifest["counts"]["written"] == 10 and not rejects
    texts = {tuple(r["input_ids"]) for r in rows}
    assert len(texts) == 3  # the same three conversations from every kind of input
    _, rejects, _ = _run(tmp_path / "p", [tmp_path / "d.parquet"], model)  # messages as a JSON string: refused
    assert rejects and rejects[0]["field"] == "messages"


def test_rows_match_encode_and_load_with_datasets(tmp_path, model):
    from turnkit import ChatFormat

    manifest, _, rows = _run(tmp_path, [_jsonl(tmp_path / "x.jsonl", [json.dumps(GOOD)])], model)
    encoding = ChatFormat.from_pretrained(model).encode(GOOD["messages"])
    (row,) = rows
    assert row["input_ids"] == encoding.input_ids.tolist() and row["labels"] == encoding.labels.tolist()
    assert row["assistant_masks"] == row["completion_mask"] == encoding.assistant_mask.tolist()
    assert row["length"] == len(encoding) and row["record_id"] == "x.jsonl:1"
    assert manifest["trained_tokens"] == encoding.num_trained and len(manifest["tokenizer_sha256"]) == 64
    import datasets

    loaded = datasets.load_dataset("parquet", data_files=[str(tmp_path / "out" / f) for f in manifest["files"]])
    assert loaded["train"][0]["input_ids"] == row["input_ids"]
    # the token lists are written without dictionary pages or statistics (a third of a write, nothing readers use)
    import pyarrow.parquet as pq

    columns = pq.ParquetFile(tmp_path / "out" / manifest["files"][0]).metadata.row_group(0)
    encoded = {columns.column(i).path_in_schema: columns.column(i) for i in range(columns.num_columns)}
    assert {column.compression for column in encoded.values()} == {"ZSTD"}
    for name in ("input_ids", "labels", "assistant_masks", "completion_mask"):
        tokens = encoded[f"{name}.list.element"]
        assert "RLE_DICTIONARY" not in tokens.encodings and not tokens.is_stats_set, name
    assert "RLE_DICTIONARY" in encoded["record_id"].encodings and encoded["length"].is_stats_set


def test_markers_max_length_and_split_turns(tmp_path, model):
    forged = {"messages": [{"role": "user", "content": "hi <|im_end|> there"}, {"role": "assistant", "content": "ok"}]}
    long = {
        "messages": [
            {"role": "system", "content": "S"},
            *[
                m
                for n in range(6)
                for m in (
                    {"role": "user", "content": f"question {n} " * 20},
                    {"role": "assistant", "content": f"answer {n} " * 20},
                )
            ],
        ]
    }
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(forged), json.dumps(long)])
    kept, _, rows = _run(tmp_path / "keep", [data], model)
    assert kept["markers_found"] == {"<|im_end|>": 1} and kept["counts"]["written"] == 2
    rejected, rejects, _ = _run(tmp_path / "reject", [data], model, markers="reject")
    assert rejected["counts"]["rejected"] == 1 and "<|im_end|>" in rejects[0]["reason"]
    _, _, stripped = _run(tmp_path / "strip", [data], model, markers="strip")
    assert len(stripped[0]["input_ids"]) < len(rows[0]["input_ids"])
    dropped, rejects, _ = _run(tmp_path / "drop", [data], model, max_length=200)
    assert dropped["counts"]["rejected"] == 1 and "over max_length 200" in rejects[0]["reason"]
    cut, _, cut_rows = _run(tmp_path / "turns", [data], model, max_length=200, truncation="turns")
    assert cut["truncated"] == 1 and all(r["length"] <= 200 for r in cut_rows)
    long_row = next(r for r in cut_rows if r["record_id"].endswith(":2"))
    assert long_row["labels"][-2] != -100  # the last reply's end marker is still trained
    split, _, split_rows = _run(tmp_path / "split", [data], model, split_turns=True)
    assert split["counts"]["rows"] == 1 + 6 and sorted(r["turn"] for r in split_rows)[-1] == 5


def test_ray_runner_gives_the_same_rows(tmp_path, model):
    pytest.importorskip("ray")
    lines = [json.dumps(GOOD), "{broken", json.dumps({"instruction": "Name a color", "output": "Blue"})] * 5
    data = _jsonl(tmp_path / "r.jsonl", lines)
    config = PrepareConfig(model=model)
    local = prepare([str(data)], tmp_path / "local", config, shard_records=4, progress=False)
    ray = prepare([str(data)], tmp_path / "ray", config, runner="ray", workers=2, shard_records=4, progress=False)
    assert local["counts"] == ray["counts"] and local["tokens"] == ray["tokens"]

    def rows(out):
        return sorted((r["record_id"], list(r["input_ids"]), list(r["labels"])) for r in load_rows(out))

    assert rows(tmp_path / "local") == rows(tmp_path / "ray")
    assert (tmp_path / "local" / "rejects.jsonl").read_text() == (tmp_path / "ray" / "rejects.jsonl").read_text()


def _tricky_jsonl() -> bytes:
    """JSONL as files come: a BOM, CRLF and lone-CR line ends, blank and whitespace-only lines (ASCII, \\x1c and
    ideographic spaces), non-ASCII text, a broken line, a line in Latin-1, and no line break at the end."""
    record = json.dumps(GOOD).encode()
    accented = json.dumps({"instruction": "Traduis « été »", "output": "summer, 夏"}, ensure_ascii=False).encode()
    return (
        b"\xef\xbb\xbf" + record + b"\r\n" + accented + b"\r\n\r\n  \t\n" + record + b"\r" + accented + b"\r\r\n"
        + "\u3000\n".encode() + b"\x1c\n{broken\n" + b'{"instruction": "caf\xe9", "output": "Latin-1"}\n'
        + record + b"\r" + b"\r" + accented + b"\n\n" + record + b"\r"
    )  # fmt: skip


@pytest.mark.parametrize("block", [1, 5, 64, None])
def test_spans_of_a_jsonl_file_hold_the_records_the_reader_reads(tmp_path, monkeypatch, block):
    """A worker reads its shard's lines itself, from a span of the file the main process found by counting lines in
    bytes (or, for a compressed file, from the span's bytes): for every shard size the spans hold exactly the records,
    ids, line numbers and text of the text reader, whatever blocks the file is read in (a block ends at a line's end;
    a file without CR is cut where numpy finds its line feeds, one with CR line by line)."""
    import zstandard

    from turnkit.data import cutting, sources

    if block is not None:
        monkeypatch.setattr(cutting, "_SPAN_BLOCK", block)
    tricky = _tricky_jsonl()
    compressions = {"": bytes, ".gz": gzip.compress, ".zst": zstandard.ZstdCompressor().compress}
    for suffix, compress in compressions.items():  # a compressed file is read forward only, its bytes sent
        data = tmp_path / f"tricky.jsonl{suffix}"
        data.write_bytes(compress(tricky))
        expected = list(sources.read_records(data))
        assert len(expected) == 9 and expected[-1].line == 16 and expected[0].text.startswith("{")  # the BOM is no data
        _spans_hold(data, expected)
        data.write_bytes(compress(b"\xef\xbb\xbf\r" + tricky[3:]))  # a first line of only the BOM, a lone CR
        _spans_hold(data, list(sources.read_records(data)))
        data.write_bytes(compress(tricky[3:].replace(b"\r\n", b"\n").replace(b"\r", b"\n")))  # no BOM, no CR
        expected = list(sources.read_records(data))
        assert len(expected) == 9 and expected[-1].line == 16
        _spans_hold(data, expected)


def test_spans_match_the_reader_on_random_files(tmp_path, monkeypatch):
    """Random files of records, blank and whitespace lines and every line end, read in random blocks: the spans hold
    the text reader's records for every shard size."""
    import random

    from turnkit.data import cutting, sources

    pieces = [b'{"a": 1}', b"", b" ", b"\t ", "\u3000".encode(), b"\x1c", b'{"b": "\xe9"}', '{"c": "夏"}'.encode()]
    ends = [b"\n", b"\r\n", b"\r"]
    generator = random.Random(7)
    for round_ in range(60):
        lines = [generator.choice(pieces) + generator.choice(ends) for _ in range(generator.randint(1, 14))]
        if generator.random() < 0.5:  # most files have no CR
            lines = [line.replace(b"\r\n", b"\n").replace(b"\r", b"\n") for line in lines]
        text = b"".join(lines)
        text = text[:-1] if generator.random() < 0.3 else text  # no line end at the end
        data = tmp_path / f"random-{round_}.jsonl"
        data.write_bytes((b"\xef\xbb\xbf" if generator.random() < 0.2 else b"") + text)
        monkeypatch.setattr(cutting, "_SPAN_BLOCK", generator.choice([1, 3, 8, 1 << 20]))
        _spans_hold(data, list(sources.read_records(data)))


def _spans_hold(data: Path, expected: list) -> None:
    from turnkit.data.cutting import JsonlSpans, records_of

    for size in range(1, 12):
        spans = JsonlSpans(str(data))
        taken = list(iter(lambda: spans.take(size), None))  # noqa: B023 - called at once
        spans.close()
        assert [span.count for span in taken[:-1]] == [size] * (len(taken) - 1)
        assert [len(list(span.records())) for span in taken] == [span.count for span in taken]
        assert records_of(taken) == expected, f"spans of {size} records of {data.name}"
        assert all((span.data is None) == (data.suffix == ".jsonl") for span in taken)  # a plain file's: no bytes


def test_two_workers_cut_shards_where_one_does_and_resume_each_other(tmp_path, model):
    """Shards are cut at the same records whoever reads the input: a run of one worker is resumed by two (and the
    inputs' kinds mix: spans of a JSONL file and of a gzipped one, records of a JSON array, a shard across files)."""
    (tmp_path / "a.jsonl").write_bytes(_tricky_jsonl())
    (tmp_path / "b.json").write_text(json.dumps([GOOD] * 3))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(_tricky_jsonl()))
    inputs = [str(tmp_path / name) for name in ("a.jsonl", "b.json", "c.jsonl.gz")]
    config = PrepareConfig(model=model)
    one = prepare(inputs, tmp_path / "one", config, workers=1, shard_records=3, progress=False)
    two = prepare(inputs, tmp_path / "two", config, workers=2, shard_records=3, progress=False)
    assert one["counts"] == two["counts"]
    assert one["counts"]["read"] == 21 and one["counts"]["rejected"] == 4  # broken, Latin-1; not the BOM
    for name in ("one", "two"):
        shards = sorted((tmp_path / name / "shards").glob("shard-*.parquet"))
        assert len(shards) == 7  # 21 records in shards of 3

    def per_shard(out: Path) -> list[list[str]]:
        import pyarrow.parquet as pq

        files = sorted((out / "shards").glob("shard-*.parquet"))
        return [pq.read_table(f, columns=["record_id"]).column(0).to_pylist() for f in files]

    assert per_shard(tmp_path / "one") == per_shard(tmp_path / "two")
    assert list(load_rows(tmp_path / "one")) == list(load_rows(tmp_path / "two"))
    assert (tmp_path / "one" / "rejects.jsonl").read_text() == (tmp_path / "two" / "rejects.jsonl").read_text()
    reasons = [json.loads(line)["reason"] for line in (tmp_path / "two" / "rejects.jsonl").read_text().splitlines()]
    assert "line 11 is not valid UTF-8: byte 0xe9 at character 21" in reasons  # the record, not the whole input
    for index in (1, 4, 5):  # a run of one worker that stopped there, resumed by two workers
        for suffix in (".parquet", ".json"):
            (tmp_path / "one" / "shards" / f"shard-{index:05d}{suffix}").unlink()
    (tmp_path / "one" / "manifest.json").unlink()
    resumed = prepare(inputs, tmp_path / "one", config, workers=2, shard_records=3, progress=False)
    assert resumed["counts"] == two["counts"]
    assert list(load_rows(tmp_path / "one")) == list(load_rows(tmp_path / "two"))


def _parquet_rows(path: Path, rows: list[dict], row_group_size: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def _mixed_rows(count: int) -> list[dict]:
    """Conversations as Parquet holds them, with what does not go: a row without messages (null), a null content."""
    rows: list[dict[str, Any]] = []
    for n in range(count):
        messages = [{"role": "user", "content": f"Question {n}, « été » 夏?"}, {"role": "assistant", "content": f"{n}"}]
        rows.append({"messages": messages, "source": f"s{n % 3}"})
    rows[3] = {"messages": None, "source": "s0"}
    if count > 7:
        rows[7]["messages"][1]["content"] = None
    return rows


def test_slices_of_a_parquet_file_hold_the_records_the_reader_reads(tmp_path):
    """A worker makes the records of its shard's Parquet rows itself, from the rows as Arrow data: for every shard size
    and row-group layout (slices across row groups, many slices in one) they are the reader's records and ids."""
    from turnkit.data.cutting import ArrowSlices, records_of
    from turnkit.data.sources import read_records

    rows = _mixed_rows(11)
    for row_group_size in (1, 4, 1000):
        data = _parquet_rows(tmp_path / f"rows-{row_group_size}.parquet", rows, row_group_size)
        expected = list(read_records(data))
        assert [record.record_id for record in expected] == [f"{data.name}:{n}" for n in range(11)]
        assert [record.data for record in expected] == rows
        for size in range(1, 13):
            slices = ArrowSlices.of_parquet(str(data))
            taken = list(iter(lambda: slices.take(size), None))  # noqa: B023 - called at once
            slices.close()
            assert [piece.count for piece in taken[:-1]] == [size] * (len(taken) - 1)
            assert records_of(taken) == expected, f"slices of {size} rows, row groups of {row_group_size}"
    many = _parquet_rows(tmp_path / "many.parquet", rows * 20, 1000)  # a slice is its rows' bytes, not its batch's
    whole, ten = ArrowSlices.of_parquet(str(many)).take(220), ArrowSlices.of_parquet(str(many)).take(10)
    assert whole is not None and ten is not None and len(ten.data) < len(whole.data) / 5
    empty = _parquet_rows(tmp_path / "empty.parquet", [], 10)
    assert ArrowSlices.of_parquet(str(empty)).take(3) is None


def test_slices_of_a_datasets_folder_hold_the_records_the_reader_reads(tmp_path):
    """A ``datasets`` folder goes to workers as Arrow rows too, split by split (a slice never spans two splits: their
    ids differ), in the dataset's own order; a dataset with a feature to decode (an image) is read and sent as records,
    since its Arrow rows hold what ``datasets`` would decode."""
    datasets = pytest.importorskip("datasets")
    from turnkit.data.cutting import records_of, shard_cutter
    from turnkit.data.sources import read_records

    rows = _mixed_rows(11)
    splits = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:4]).select([3, 0, 2])}
    )
    splits.save_to_disk(tmp_path / "splits")
    datasets.Dataset.from_list(rows).shuffle(seed=1).save_to_disk(tmp_path / "one")
    for folder in ("splits", "one"):
        expected = list(read_records(tmp_path / folder))
        assert len(expected) == (14 if folder == "splits" else 11)
        for size in range(1, 13):
            cutter = shard_cutter(str(tmp_path / folder))
            assert cutter is not None
            taken = list(iter(lambda: cutter.take(size), None))  # noqa: B023 - called at once
            assert records_of(taken) == expected, f"slices of {size} rows of {folder}"
    assert [r.record_id for r in read_records(tmp_path / "splits")][-3:] == [f"splits:test:{n}" for n in range(3)]
    pictures = datasets.Dataset.from_dict({"image": [None]}, features=datasets.Features({"image": datasets.Image()}))
    pictures.save_to_disk(tmp_path / "pictures")
    assert shard_cutter(str(tmp_path / "pictures")) is None


def test_two_workers_read_parquet_rows_as_one_worker_does(tmp_path, model):
    """Parquet inputs and ``datasets`` folders are sent to workers as rows of Arrow data: the shards, rejects and
    counts of two workers are one worker's, with shards across a Parquet file, a JSONL file and a folder's splits."""
    datasets = pytest.importorskip("datasets")
    splits = {"train": datasets.Dataset.from_list(_mixed_rows(8)), "test": datasets.Dataset.from_list(_mixed_rows(5))}
    datasets.DatasetDict(splits).save_to_disk(tmp_path / "d")
    inputs = [
        str(_parquet_rows(tmp_path / "a.parquet", _mixed_rows(10), row_group_size=4)),
        str(_jsonl(tmp_path / "b.jsonl", [json.dumps(GOOD)] * 2)),
        str(_parquet_rows(tmp_path / "c.parquet", _mixed_rows(9), row_group_size=1000)),
        str(tmp_path / "d"),
    ]
    config = PrepareConfig(model=model)
    one = prepare(inputs, tmp_path / "one", config, workers=1, shard_records=3, progress=False)
    two = prepare(inputs, tmp_path / "two", config, workers=2, shard_records=3, progress=False)
    assert one["counts"] == two["counts"]
    assert one["counts"]["read"] == 34 and one["counts"]["rejected"] == 7  # no messages, a null content
    assert list(load_rows(tmp_path / "one")) == list(load_rows(tmp_path / "two"))
    assert (tmp_path / "one" / "rejects.jsonl").read_text() == (tmp_path / "two" / "rejects.jsonl").read_text()
    rejected = [json.loads(line)["record_id"] for line in (tmp_path / "two" / "rejects.jsonl").read_text().splitlines()]
    assert rejected == [*(f"{name}:{n}" for name in ("a.parquet", "c.parquet", "d:train") for n in (3, 7)), "d:test:3"]


def test_a_killed_run_resumes_to_the_same_output(tmp_path, model):
    lines = [
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": f"Question number {n}?"},
                    {"role": "assistant", "content": f"Answer number {n}."},
                ]
            }
        )
        for n in range(1500)
    ]
    data = _jsonl(tmp_path / "big.jsonl", [*lines[:700], "{oops", *lines[700:]])
    command = [sys.executable, "-m", "turnkit.cli", "prepare", str(data), "--model", model, "--shard-records", "50"]
    reference = subprocess.run([*command, "--out", str(tmp_path / "clean")], capture_output=True, text=True)
    assert reference.returncode == 0, reference.stderr
    crashed = tmp_path / "crashed"
    process = subprocess.Popen([*command, "--out", str(crashed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (crashed / "shards" / "shard-00004.json").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done = len(list((crashed / "shards").glob("shard-*.json")))
    assert 0 < done < 31, "the run was killed after it finished or before any shard"
    assert not (crashed / "manifest.json").exists()
    resumed = subprocess.run([*command, "--out", str(crashed)], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert list(load_rows(crashed)) == list(load_rows(tmp_path / "clean"))
    assert (crashed / "rejects.jsonl").read_text() == (tmp_path / "clean" / "rejects.jsonl").read_text()
    clean = json.loads((tmp_path / "clean" / "manifest.json").read_text())
    again = json.loads((crashed / "manifest.json").read_text())
    assert again["counts"] == clean["counts"] == {**clean["counts"], "read": 1501, "written": 1500, "rejected": 1}
    with pytest.raises(PrepareError, match="other options"):
        prepare([str(data)], crashed, PrepareConfig(model=model, turns="last"), shard_records=50, progress=False)


def test_sft_trainer_trains_on_the_shards_with_turnkits_labels(tmp_path, model, smollm2_gguf):
    pytest.importorskip("trl")
    import math

    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from turnkit.serve.engines.torch import _converted_gguf

    torch.set_num_threads(1)
    records = [
        {
            "messages": [
                {"role": "user", "content": f"What is {n}+{n}?"},
                {"role": "assistant", "content": f"{n}+{n} is {2 * n}."},
            ]
        }
        for n in range(12)
    ]
    data = _jsonl(tmp_path / "sft.jsonl", [json.dumps(r) for r in records])
    manifest = prepare([str(data)], tmp_path / "out", PrepareConfig(model=model), progress=False)
    dataset = datasets.load_dataset(
        "parquet", data_files=[str(tmp_path / "out" / f) for f in manifest["files"]], split="train"
    )
    config = SFTConfig(
        output_dir=str(tmp_path / "trainer"),
        max_steps=5,
        per_device_train_batch_size=2,
        learning_rate=1e-5,
        completion_only_loss=True,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        logging_steps=1,
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(_converted_gguf(smollm2_gguf)),
        args=config,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model),
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    for i in range(2):
        labels = dataset[i]["labels"]
        assert batch["labels"][i][: len(labels)].tolist() == labels  # TRL trains exactly turnkit's labels
    result = trainer.train()
    assert result.global_step == 5 and math.isfinite(result.training_loss)


def test_field_mappings(tmp_path, model):
    record = {"dialog": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], "fns": None}
    data = _jsonl(tmp_path / "m.jsonl", [json.dumps(record)])
    manifest, _, _ = _run(
        tmp_path, [data], model, input_format="openai", fields=FieldMap(messages="dialog", tools="fns")
    )
    assert manifest["counts"]["written"] == 1


TOOL_CALL_ONLY = {
    "id": "weather",
    "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
    ],
    "tools": [WEATHER_TOOL],
}


def test_engine_is_runner_s_old_name_still_taken_with_a_warning(tmp_path, capsys, model):
    """``--engine`` and ``prepare(engine=...)``, ``--runner``'s old name ("engine" names the serving engines only),
    still work, each saying the new name; the manifest names the runner; old and new names that disagree are refused."""
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(GOOD)])
    out = tmp_path / "old-flag"
    assert main(["prepare", str(data), "--model", "default", "--out", str(out), "--engine", "local"]) == 0
    assert "turnkit: warning: --engine is now --runner (--runner local)" in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["runner"] == "local"
    argv = ["prepare", str(data), "--model", "default", "--out", str(tmp_path / "both")]
    assert main([*argv, "--engine", "local", "--runner", "ray"]) == 2
    assert "--runner ray and --engine local disagree" in capsys.readouterr().err
    with pytest.warns(DeprecationWarning, match=r"prepare\(engine=...\) is now prepare\(runner=...\)"):
        manifest = prepare([str(data)], tmp_path / "old-keyword", PrepareConfig(model=model), engine="local")
    assert manifest["runner"] == "local" and manifest["counts"]["written"] == 1


def test_a_turn_the_template_does_not_render_is_rejected_not_trained(tmp_path, capsys):
    """SmolLM2's template writes no tool calls: the turn would train `<|im_start|>assistant\\n<|im_end|>` alone."""
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps({"id": "plain", **GOOD}), json.dumps(TOOL_CALL_ONLY)])
    out = tmp_path / "out"
    assert main(["prepare", str(data), "--model", "default", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 1 and manifest["counts"]["rejected"] == 1
    (reject,) = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert reject["record_id"] == "weather" and reject["field"] == "messages[1].tool_calls"
    assert reject["reason"].startswith("message 1, field 'tool_calls': the template does not write")
    assert "an empty reply" in reject["reason"] and "--allow-dropped" in reject["reason"]
    assert "message …, field 'tool_calls': the template does not write" in printed  # the field is not elided
    assert [r["record_id"] for r in load_rows(out)] == ["plain"]

    kept = tmp_path / "kept"
    assert main(["prepare", str(data), "--model", "default", "--out", str(kept), "--allow-dropped"]) == 0
    assert json.loads((kept / "manifest.json").read_text())["counts"]["written"] == 2


QWEN3_RECORD = {
    "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning_content": "Two and two.", "content": "4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "reasoning_content": "Three and three.", "content": "6"},
    ]
}


@pytest.fixture(scope="module")
def qwen3_format(tmp_path_factory, smollm2_hf_folder) -> str:
    """Qwen3's template (it drops the reasoning of turns before the last user message) on the SmolLM2 tokenizer."""
    from corpus import template_text

    folder = tmp_path_factory.mktemp("qwen3-format")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_hf_folder / name, folder / name)
    (folder / "chat_template.jinja").write_text(template_text("Qwen-Qwen3-0.6B.jinja"))
    return str(folder)


def test_reasoning_a_template_drops_from_earlier_turns_is_counted(tmp_path, qwen3_format, capsys):
    """Qwen3 drops the reasoning of turns before the last user message, by design: allowed, and counted."""
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(QWEN3_RECORD), json.dumps(GOOD)])
    out = tmp_path / "out"
    assert main(["prepare", str(data), "--model", qwen3_format, "--out", str(out), "--turns", "last"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["written"] == 2 and manifest["counts"]["rejected"] == 0
    assert manifest["reasoning_left_out"] == {"turns": 1, "records": 1}
    assert "reasoning left out            1   turns in 1 records" in capsys.readouterr().out


def test_failed_runs_leave_no_traceback_and_no_litter(tmp_path, capsys, monkeypatch):
    """An --out that is a file, a missing input, an input that is not JSON, an unreachable hub: one line, exit 2, and
    no empty OUT/shards/ left behind; the hub answers at once when it cannot be reached (no ~30 s of retries)."""
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(GOOD)])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # the discard port: nothing listens, refused at once
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    cases = [
        ([str(data), "--out", str(data)], f"--out {data} is a file: give a folder"),
        ([str(tmp_path / "nowhere.jsonl"), "--out", str(tmp_path / "a")], "nowhere.jsonl does not exist"),
        ([str(bad), "--out", str(tmp_path / "b")], "bad.json is not valid JSON"),
        (
            ["hub:foo/bar", "--out", str(tmp_path / "c")],
            "cannot load hub:foo/bar: the Hugging Face hub is offline here",
        ),
    ]
    for arguments, message in cases:
        assert main(["prepare", "--model", "default", *arguments]) == 2
        err = capsys.readouterr().err
        assert err.startswith("turnkit: error: ") and message in err and "Traceback" not in err, err
        assert "Retrying" not in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "d.jsonl"]


def test_options_that_cannot_work_are_refused(tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(GOOD)])
    out = str(tmp_path / "out")
    for flag, value in (("--max-length", "0"), ("--workers", "0"), ("--shard-records", "-3")):
        with pytest.raises(SystemExit) as exit_:
            main(["prepare", str(data), "--model", "default", "--out", out, flag, value])
        assert exit_.value.code == 2
        assert f"argument {flag}: must be at least 1, not {int(value)}" in capsys.readouterr().err
    with pytest.raises(PrepareError, match="--max-length must be at least 1 token"):
        prepare([str(data)], out, PrepareConfig(model="default", max_length=0), progress=False)
    assert main(["prepare", str(data), "--model", "nosuch", "--out", out]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "turnkit: error: --model nosuch does not exist; give a Hugging Face model folder, a .gguf file, or "
        + ("'default'\n")
    )
    assert not (tmp_path / "out").exists()


def test_reject_reasons_name_the_field_and_the_flag(tmp_path, qwen3_format, capsys):
    """The summary keeps the quoted field name a user acts on, and advice names prepare's flag, not encode's keyword."""
    no_role = {"messages": [{"content": "hi"}, {"role": "assistant", "content": "x"}]}
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(QWEN3_RECORD), json.dumps(no_role)])
    out = tmp_path / "out"
    assert main(["prepare", str(data), "--model", qwen3_format, "--out", str(out)]) == 1  # both rejected
    printed = capsys.readouterr().out
    assert "the message has no 'role'" in printed
    rejects = {r["source"]: r for r in map(json.loads, (out / "rejects.jsonl").read_text().splitlines())}
    assert rejects["d.jsonl:1"]["field"] is None
    reason = rejects["d.jsonl:1"]["reason"]
    assert "prepare with --split-turns" in reason and "split_turns=True" not in reason
    assert "prepare with --split-turns" in printed


# -- what a run says of itself (issue 34 item 15) -------------------------------------------------------------------


def _prepare_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["prepare", "--model", "default", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_run_that_writes_no_record_fails_after_its_summary(tmp_path, capsys):
    """Every record rejected, every record cut by --max-length, or an empty input: the summary, one error line, exit 1
    (it exited 0), with the manifest and rejects written as usual."""
    no_reply = {"messages": [{"role": "user", "content": "Hi"}]}
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(no_reply), "{not json"])
    code, out, err = _prepare_cli(capsys, str(data), "--out", str(tmp_path / "a"))
    assert code == 1 and "records written               0" in out
    rejects = tmp_path / "a" / "rejects.jsonl"
    assert err == f"turnkit: error: no record was written: all 2 records read were rejected (see {rejects})\n"
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["counts"]["rejected"] == 2

    long = _jsonl(tmp_path / "long.jsonl", [json.dumps(GOOD)] * 3)
    code, out, err = _prepare_cli(capsys, str(long), "--out", str(tmp_path / "b"), "--max-length", "4")
    assert code == 1 and "3  too long: … tokens, over max_length … (truncation=drop)" in out
    assert err.startswith("turnkit: error: no record was written: all 3 records read were rejected")

    empty = _jsonl(tmp_path / "empty.jsonl", [])
    code, out, err = _prepare_cli(capsys, str(empty), "--out", str(tmp_path / "c"))
    assert code == 1 and "records read                  0" in out
    assert err == "turnkit: error: no record was written: the inputs hold no records\n"

    # one record written is a run that worked
    code, _, err = _prepare_cli(capsys, str(data), str(long), "--out", str(tmp_path / "d"))
    assert code == 0 and err == ""


def test_records_that_share_an_id_are_counted_and_named(tmp_path, capsys):
    """They are written (no shard sees another's ids) but no longer silently: the summary, a warning line naming the
    first with where each copy was read, and the manifest. Rows of one record split into turns share its id rightly."""
    one = {"id": "r1", **GOOD}
    two_turns = {
        "id": "r2",
        "messages": [*GOOD["messages"], {"role": "user", "content": "And 3+3?"}, {"role": "assistant", "content": "6"}],
    }
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(one), json.dumps(two_turns), json.dumps({"id": "r3", **GOOD})])
    code, out, err = _prepare_cli(capsys, str(data), "--out", str(tmp_path / "split"), "--split-turns")
    assert code == 0 and err == "" and "duplicate ids" not in out
    manifest = json.loads((tmp_path / "split" / "manifest.json").read_text())
    assert manifest["counts"]["rows"] == 4 and manifest["duplicate_ids"] == {"ids": 0, "records": 0, "examples": []}

    lines = [json.dumps(one), json.dumps(two_turns), json.dumps(one), json.dumps({"id": "r2", **GOOD})]
    lines += [json.dumps(one), json.dumps({"id": "r4", **GOOD})]
    data = _jsonl(tmp_path / "dup.jsonl", lines)
    # across shards (2 records a shard) and with two workers: the same answer
    for extra in ([], ["--workers", "2"]):
        out_dir = tmp_path / f"dup{len(extra)}"
        code, out, err = _prepare_cli(capsys, str(data), "--out", str(out_dir), "--shard-records", "2", *extra)
        assert code == 0 and len(list(load_rows(out_dir))) == 6
        assert "duplicate ids                 5   records share 2 ids (first: 'r1' at dup.jsonl:1, dup.jsonl:3, " in out
        assert err == (
            "turnkit: warning: 5 written records share 2 ids (first: 'r1', read at dup.jsonl:1 and dup.jsonl:3 and "
            "dup.jsonl:5): an id no longer names one record; give each record its own id, or --id-field another "
            "field (the manifest's duplicate_ids lists more)\n"
        )
        assert json.loads((out_dir / "manifest.json").read_text())["duplicate_ids"] == {
            "ids": 2,
            "records": 5,
            "examples": [
                {"record_id": "r1", "sources": ["dup.jsonl:1", "dup.jsonl:3", "dup.jsonl:5"]},
                {"record_id": "r2", "sources": ["dup.jsonl:2", "dup.jsonl:4"]},
            ],
        }
    # the same input named twice would write every record twice: refused
    again = f"{tmp_path}/./dup.jsonl"
    code, _, err = _prepare_cli(capsys, str(data), again, "--out", str(tmp_path / "x"))
    assert code == 2 and err == (
        f"turnkit: error: input {again} is named twice (as {data} and {again}): each of its records would be "
        "written twice\n"
    )
    assert not (tmp_path / "x").exists()


def test_records_named_by_where_they_were_read_are_counted(tmp_path, capsys):
    """A record without an id is named by its file and line, an id that changes when the input is reordered: the
    summary and the manifest say how many (it was said nowhere but the id_field's wording; issue 45)."""
    lines = [json.dumps({"id": "r1", **GOOD}), json.dumps(GOOD), json.dumps({"id": 7, **GOOD}), "{not json"]
    data = _jsonl(tmp_path / "d.jsonl", [*lines, json.dumps({"id": "", **GOOD})])
    for extra in ([], ["--workers", "2", "--shard-records", "2"]):
        out_dir = tmp_path / f"out{len(extra)}"
        code, out, err = _prepare_cli(capsys, str(data), "--out", str(out_dir), *extra)
        assert code == 0 and err == ""
        assert (
            "ids from source               3   records have no 'id' field: each is named by where it was read "
            "(file:line)" in out
        )
        manifest = json.loads((out_dir / "manifest.json").read_text())
        assert manifest["record_ids"] == {"own": 2, "from_source": 3}
        assert sorted(row["record_id"] for row in load_rows(out_dir)) == ["7", "d.jsonl:2", "d.jsonl:5", "r1"]
    code, out, _ = _prepare_cli(capsys, str(data), "--out", str(tmp_path / "uid"), "--id-field", "id")
    assert json.loads((tmp_path / "uid" / "manifest.json").read_text())["record_ids"] == {"own": 2, "from_source": 3}
    named = _jsonl(tmp_path / "named.jsonl", [json.dumps({"id": f"r{n}", **GOOD}) for n in range(3)])
    code, out, _ = _prepare_cli(capsys, str(named), "--out", str(tmp_path / "named"))
    assert code == 0 and "ids from source" not in out
    assert json.loads((tmp_path / "named" / "manifest.json").read_text())["record_ids"] == {"own": 3, "from_source": 0}


def test_a_rerun_with_nothing_to_do_says_so(tmp_path, capsys):
    data = _jsonl(tmp_path / "d.jsonl", [json.dumps(GOOD)] * 5)
    out_dir = tmp_path / "out"
    code, first, _ = _prepare_cli(capsys, str(data), "--out", str(out_dir), "--shard-records", "2")
    assert code == 0 and first.endswith("and 3 Parquet files\n")
    assert json.loads((out_dir / "manifest.json").read_text())["shards"] == {"total": 3, "resumed": 0}
    code, again, _ = _prepare_cli(capsys, str(data), "--out", str(out_dir), "--shard-records", "2")
    assert code == 0 and again.endswith(
        f"\nnothing to do: {out_dir} holds all 3 shards from an earlier run with the same options (delete {out_dir} "
        "to prepare it again); manifest.json and rejects.jsonl rewritten from them\n"
    )
    assert json.loads((out_dir / "manifest.json").read_text())["shards"] == {"total": 3, "resumed": 3}
    # a run that finds some shards done says how many
    (out_dir / "shards" / "shard-00001.json").unlink()
    code, resumed, _ = _prepare_cli(capsys, str(data), "--out", str(out_dir), "--shard-records", "2")
    assert code == 0 and resumed.endswith("and 3 Parquet files (2 of 3 shards from an earlier run)\n")
    assert len(list(load_rows(out_dir))) == 5
