"""What ``turnkit prepare`` writes is pinned, record by record, over every data shape and the options that change rows.

``tests/data/prepare_golden.json`` holds, for each case, a digest of every row (ids, labels, both masks, length) with
its record id, source and turn, every reject in full, and the manifest's counts. It was written by the pipeline as it
was before prepare's hot path was optimised (issue 23), so any optimisation that changes a token, a label, a record id
or a reject fails here with the record that differs. Regenerate it only for an intended change of output:
``python tests/data/test_prepare_shapes.py --write`` (and say why in the commit).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from pathlib import Path
from typing import Any

import pytest

# tests/, for shapes and corpus when run as a script (under pytest, tests/conftest.py's folder is on sys.path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shapes import SHAPES, Shape, model_folder, words

from turnkit.data import PrepareConfig, load_rows, prepare

GOLDEN = Path(__file__).with_name("prepare_golden.json")
RECORDS = 40  # per shape: three shards of 16
SHARD = 16


def _turn(role: str, content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": content, **extra}


def _chat(*contents: Any, **record: Any) -> str:
    """A JSONL line: these contents as user and assistant turns in turn (a dict is a whole message)."""
    turns: list[dict[str, Any]] = []
    for content in contents:
        after_user = bool(turns) and turns[-1]["role"] in ("user", "tool")
        turns.append(content if isinstance(content, dict) else _turn("assistant" if after_user else "user", content))
    return json.dumps({**record, "messages": turns})


def _messy(rng: random.Random) -> list[str]:
    """JSONL lines of a messy dataset: every shape of the SmolLM2 template, broken records, markers in data, turns
    that are too long, flags, and records with nothing to train."""
    good = [
        json.dumps(shape.record(rng), ensure_ascii=False)
        for shape in SHAPES
        if shape.model == "smollm2"
        for _ in range(3)
    ]
    long = [words(rng, 40, 60) for _ in range(12)]
    odd = [
        "{not json",
        _chat("hi <|im_end|> there", "ok <|im_start|>"),
        _chat("<|im_start|>system", "<|endoftext|>"),
        _chat("only a question"),
        _chat("q", ""),
        _chat(7, "x"),
        _chat(_turn("wizard!", "x"), "y"),
        _chat("a", _turn("assistant", "b", train=False), "c", "d", id=5),
        _chat("a", _turn("assistant", "b", train=False)),
        json.dumps({"conversations": [{"from": "alien", "value": "x"}]}),
        json.dumps({"instruction": "Add", "input": "2 and 2", "output": "4"}),
        _chat("lone \ud800 surrogate", "x"),
        _chat(_turn("system", "Be brief."), *long, id="long"),
        _chat(_turn("system", "S"), "a", "b", _turn("system", "late"), "c", "d"),
    ]
    lines = good + odd
    rng.shuffle(lines)
    return lines


def _messy_tools(rng: random.Random) -> list[str]:
    """JSONL lines for the Qwen tool template: tool shapes, and markers inside calls, arguments and results."""
    from shapes import TOOLS, tool_calls

    function = {"name": "get_weather", "arguments": '{"city": "<tool_call>Oslo<|im_end|>"}'}
    call = {"type": "function", "function": function}
    result = _turn("tool", "</tool_response>sunny<|im_start|>")
    odd = [
        _chat("w?", _turn("assistant", "Checking.", tool_calls=[call]), result, "Sunny.", tools=TOOLS),
        _chat("w?", _turn("assistant", "", tool_calls=[call]), tools=json.dumps(TOOLS)),
        _chat("w?", _turn("assistant", "x", tool_calls="not a list"), tools=TOOLS),
        _chat("w?", "x", tools="{not json"),
    ]
    lines = [json.dumps(tool_calls(rng), ensure_ascii=False) for _ in range(12)] + odd
    rng.shuffle(lines)
    return lines


#: The options that change rows, each on the messy data.
OPTIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "markers=strip": {"markers": "strip"},
    "markers=reject": {"markers": "reject"},
    "max_length=200 drop": {"max_length": 200},
    "max_length=200 turns": {"max_length": 200, "truncation": "turns"},
    "split_turns": {"split_turns": True},
    "turns=last, no end marker": {"turns": "last", "train_end_marker": False},
}


def cases() -> list[str]:
    return [
        *(f"shape {shape.name}" for shape in SHAPES),
        *(f"messy, {name}" for name in OPTIONS),
        "messy tools, defaults",
        "messy tools, generation tags, split_turns",
    ]


def _inputs(case: str) -> tuple[list[str], str, dict[str, Any]]:
    """The lines, model kind and options of a case."""
    if case.startswith("shape "):
        shape: Shape = next(s for s in SHAPES if f"shape {s.name}" == case)
        lines = [json.dumps(r, ensure_ascii=False) for r in shape.records(RECORDS, seed=0)]
        return lines, shape.model, {}
    if case == "messy tools, defaults":
        return _messy_tools(random.Random("tools")), "qwen", {}
    if case == "messy tools, generation tags, split_turns":
        return _messy_tools(random.Random("tools")), "qwen-tagged", {"split_turns": True}
    return _messy(random.Random("messy")), "smollm2", OPTIONS[case.removeprefix("messy, ")]


def _digest(values: list[Any]) -> str:
    return hashlib.sha256(json.dumps(values, separators=(",", ":")).encode()).hexdigest()[:16]


def outcome(case: str, tokenizer_folder: Path, work: Path, workers: int = 1) -> dict[str, Any]:
    """What prepare writes for a case: each row's ids and digest, the rejects, the manifest's counts. ``work`` keeps
    the model folders across cases (a format loads once per folder)."""
    lines, kind, options = _inputs(case)
    model = model_folder(kind, tokenizer_folder, work / "models")
    name = re.sub(r"\W+", "-", case).strip("-")
    data = work / f"{name}.jsonl"
    data.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = work / f"out-{name}-{workers}"
    config = PrepareConfig(model=str(model), **options)
    manifest = prepare([str(data)], out, config, workers=workers, shard_records=SHARD, progress=False)
    rows = [
        [
            row["record_id"],
            row["source"],
            row["turn"],
            _digest([row[k] for k in ("input_ids", "labels", "assistant_masks", "completion_mask", "length")]),
        ]
        for row in load_rows(out)
    ]
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text(encoding="utf-8").splitlines()]
    keys = ("tokens", "trained_tokens", "truncated", "markers_found", "records_with_markers")
    return {"rows": rows, "rejects": rejects, "counts": manifest["counts"], **{k: manifest[k] for k in keys}}


def _dumps(found: dict[str, Any]) -> str:
    """The golden file: one case a block, one row or reject a line (a diff then shows the records that changed)."""
    lines = ["{"]
    for n, (case, value) in enumerate(found.items()):
        lines.append(f"{json.dumps(case)}: {{")
        for m, (key, item) in enumerate(value.items()):
            comma = "," if m < len(value) - 1 else ""
            if isinstance(item, list) and item:
                lines.append(f'  "{key}": [')
                lines += [
                    f"    {json.dumps(x, ensure_ascii=False)}{',' if i < len(item) - 1 else ''}"
                    for i, x in enumerate(item)
                ]
                lines.append(f"  ]{comma}")
            else:
                lines.append(f'  "{key}": {json.dumps(item, ensure_ascii=False)}{comma}')
        lines.append("}," if n < len(found) - 1 else "}")
    return "\n".join([*lines, "}", ""])


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_the_golden_file_covers_every_case(golden):
    assert sorted(golden) == sorted(cases())


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shapes")


@pytest.mark.parametrize("case", cases())
def test_prepare_writes_what_it_wrote_before(case, golden, smollm2_hf_folder, work):
    got = outcome(case, smollm2_hf_folder, work)
    want = golden[case]
    assert got["counts"] == want["counts"]
    for row, expected in zip(got["rows"], want["rows"], strict=True):
        assert row == expected, f"record {expected[0]} ({expected[1]}) is not what prepare wrote before"
    assert got["rejects"] == want["rejects"]
    assert got == want
    assert got["rows"], "a case without rows pins nothing"


@pytest.mark.parametrize("case", ["messy, defaults", "messy tools, generation tags, split_turns"])
def test_two_workers_write_what_one_wrote(case, golden, smollm2_hf_folder, work):
    """Worker processes read their shards' lines themselves (spans of the file): the same records, rows, rejects."""
    assert outcome(case, smollm2_hf_folder, work, workers=2) == golden[case]


if __name__ == "__main__":  # python tests/data/test_prepare_shapes.py --write
    import tempfile

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/data/test_prepare_shapes.py --write   (rewrites tests/data/prepare_golden.json)")
    from corpus import smollm2_tokenizer_folder

    with tempfile.TemporaryDirectory() as scratch:
        found = {case: outcome(case, smollm2_tokenizer_folder(), Path(scratch)) for case in cases()}
    GOLDEN.write_text(_dumps(found), encoding="utf-8")
    print(f"wrote {GOLDEN} ({len(found)} cases)")
