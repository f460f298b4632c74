"""Where ``turnkit prepare``'s time goes: CPU time by stage, for every shape of ``tests/shapes.py``.

Usage: python benchmarks/prepare_stages.py [--shapes NAME,...] [--conversations N] [--shard-records S]

One worker's work, in this process and one thread (no tokenizer or writer thread, so that every stage is counted where
it runs), as ``--workers 2`` does it: the input cut into shards of lines (spans of the file: what the main process
does), each shard's spans pickled and unpickled as they travel to a worker process and its lines read there, processed
by ``process_records``, its Arrow table built, its Parquet file and done-file written. A statistical profiler attributes
the CPU time: every quarter millisecond of the process's CPU time (``ITIMER_PROF``, so that other jobs on the machine do
not count) it looks at the Python stack and charges the time since the last look to the stage running, the innermost
function of the pipeline on the stack (a render that the history check asks for counts as history). Native code
(tiktoken, pyarrow) counts in the stage that called it. "other" is what no stage holds: the loops and bookkeeping
between them. The shares hold under load; ns a token are CPU time, higher on a busy machine (shared caches) than on a
quiet one.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import pickle
import signal
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import smollm2_tokenizer_folder
from shapes import SHAPES, model_folder

import turnkit.data.pipeline as pipeline
import turnkit.encode.encoder as encoder
import turnkit.encode.job as job
import turnkit.encode.marking as marking
import turnkit.encode.tokenize as tokenize
from turnkit.collector import FEWER_COLLECTIONS
from turnkit.data import PrepareConfig, output
from turnkit.data.cutting import JsonlSpan, records_of
from turnkit.data.sources import RawRecord
from turnkit.encode.attribution import Spans, Turns
from turnkit.encode.controls import ControlCheck, MissingMarkers
from turnkit.encode.encoding import Encoding
from turnkit.encode.history import History
from turnkit.encode.masks import Masks
from turnkit.encode.tokenize import SegmentCache
from turnkit.template.splice import SplicingRenderer

preparing = importlib.import_module("turnkit.data.prepare")  # (the package's `prepare` is the function)
INTERVAL_S = 0.00025

#: In the order of the pipeline.
STAGES = [
    "find shards' lines",
    "read lines in a worker",
    "parse JSON",
    "convert records",
    "scan for markers",
    "normalize messages",
    "mark data",
    "render (splice)",
    "history (masks)",
    "find control tokens",
    "tokenize",
    "assemble ids",
    "check control ids",
    "turns and masks",
    "encoding arrays",
    "Arrow table",
    "write Parquet",
    "accounting",
    "other",
]


def _read(inputs: list[str], size: int) -> list[list[RawRecord | JsonlSpan]]:
    return list(preparing._shards(inputs, size, by_reference=True))


def _transfer(shard: list[RawRecord | JsonlSpan]) -> list[RawRecord]:
    return records_of(pickle.loads(pickle.dumps(shard)))  # what a worker process is sent, and the lines it reads


def _code(owner: Any, attribute: str) -> CodeType | None:
    found = getattr(owner, attribute, None)  # None: not in this version of turnkit
    found = getattr(found, "__func__", found)
    return getattr(found, "__code__", None)


#: (owner, function, stage), the functions of the pipeline each stage is
FUNCTIONS: list[tuple[Any, str, str]] = [
    (sys.modules[__name__], "_read", "find shards' lines"),
    (RawRecord, "read", "parse JSON"),
    (pipeline, "to_conversation", "convert records"),
    (pipeline, "record_id", "convert records"),
    (pipeline, "_scan", "scan for markers"),
    (job, "normalize_conversation", "normalize messages"),
    (marking.DataMarker, "prepare", "mark data"),
    (SplicingRenderer, "render", "render (splice)"),
    *((History, name, "history (masks)") for name in ("check_as_generated", "header", "prompt_start", "ending")),
    (job, "find_controls", "find control tokens"),
    (MissingMarkers, "check", "find control tokens"),
    (SegmentCache, "fill", "tokenize"),
    (tokenize, "segments", "tokenize"),
    (SegmentCache, "assemble", "assemble ids"),
    (ControlCheck, "__call__", "check control ids"),
    (encoder, "find_turns", "turns and masks"),
    (Masks, "mask", "turns and masks"),
    (Turns, "__init__", "turns and masks"),
    (Spans, "tokens", "turns and masks"),
    (Encoding, "from_arrays", "encoding arrays"),
    (preparing, "_table", "Arrow table"),
    (preparing, "_write_shard", "write Parquet"),
    (preparing, "_summary", "accounting"),
    (sys.modules[__name__], "_transfer", "read lines in a worker"),
]
#: Stages that hold whatever runs inside them (the history check renders, tokenizes nothing, and so on).
CONTAINERS = frozenset({"history (masks)"})


class Sampler:
    """CPU time by stage, sampled: see the module."""

    def __init__(self) -> None:
        self.stages: dict[CodeType, str] = {}
        for owner, attribute, stage in FUNCTIONS:
            code = _code(owner, attribute)
            if code is not None:
                self.stages[code] = stage
        self.totals: dict[str, int] = defaultdict(int)
        self.last = 0

    def _stage(self, frame: FrameType | None) -> str:
        found = None
        while frame is not None:
            stage = self.stages.get(frame.f_code)
            if stage is not None:
                if stage in CONTAINERS:
                    return stage
                found = found or stage
            frame = frame.f_back
        return found or "other"

    def _sample(self, signum: int, frame: FrameType | None) -> None:
        now = time.process_time_ns()
        self.totals[self._stage(frame)] += now - self.last
        self.last = now

    def __enter__(self) -> Sampler:
        self.previous = signal.signal(signal.SIGPROF, self._sample)
        self.last = time.process_time_ns()
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)
        return self

    def __exit__(self, *exc: object) -> None:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, self.previous)
        self.totals[self._stage(None)] += time.process_time_ns() - self.last


def _run(inputs: list[str], config: PrepareConfig, size: int, folder: Path) -> int:
    """One worker's work on ``inputs``, in this thread; returns the tokens."""
    tokens = 0
    for index, records in enumerate(_read(inputs, size)):
        result = pipeline.process_records(_transfer(records), config, spare_core=False)
        table = output.shard_table(result.rows)
        output.write_shard(folder, index, table, preparing._summary(index, config, result))
        tokens += result.tokens
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", help="comma-separated shape names (default: all)")
    parser.add_argument("--conversations", type=int, default=4096)
    parser.add_argument("--shard-records", type=int, default=512)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    wanted = args.shapes.split(",") if args.shapes else [s.name for s in SHAPES]
    work = Path(tempfile.mkdtemp(prefix="turnkit-stages-"))
    tokenizer_folder = smollm2_tokenizer_folder()
    columns: dict[str, dict[str, float]] = {}
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for shape in [s for s in SHAPES if s.name in wanted]:
        model = str(model_folder(shape.model, tokenizer_folder, work / "models"))
        config = PrepareConfig(model=model)
        data = work / "data.jsonl"
        warm = shape.records(50, seed=-1)
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in warm), encoding="utf-8")
        _run([str(data)], config, args.shard_records, work)  # loads the format, compiles, traces, imports pyarrow
        records = shape.records(args.conversations, seed=0)
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        pipeline._format(model).encoder.segment_cache.clear()
        before = gc.get_threshold()
        gc.collect()
        gc.set_threshold(FEWER_COLLECTIONS, *before[1:])  # as prepare runs
        with Sampler() as sampler:
            tokens = _run([str(data)], config, args.shard_records, work)
        gc.set_threshold(*before)
        total = sum(sampler.totals.values())
        columns[shape.name] = {k: v / tokens for k, v in sampler.totals.items()} | {"total": total / tokens}
        print(f"{shape.name}: {args.conversations:,} records, {tokens / args.conversations:,.0f} tokens each, "
              f"{total / tokens:,.0f} CPU ns a token", flush=True)  # fmt: skip
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"\nCPU ns a token by stage (share of the total), sampled every {INTERVAL_S * 1000:g} ms; load average {load}"
    )
    names = list(columns)
    print(f"{'stage':22}" + "".join(f"{n[:17]:>18}" for n in names))
    for stage in [*STAGES, "total"]:
        cells = []
        for name in names:
            value = columns[name].get(stage, 0.0)
            share = value / columns[name]["total"] * 100
            cells.append(f"{value:>9,.0f} ({share:>4.1f}%)" if stage != "total" else f"{value:>9,.0f}         ")
        print(f"{stage:22}" + "".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
