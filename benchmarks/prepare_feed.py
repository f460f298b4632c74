"""What feeding the workers costs the process that reads the input, a record, by input kind.

Usage: python benchmarks/prepare_feed.py [--records N] [--repeats R]

``turnkit prepare`` with several workers (local processes, or Ray actors across machines) has one process read the
inputs, cut them into shards and send each shard to a worker: that process's work a record bounds how many records a
second any number of workers can be given. For plain JSONL, gzipped JSONL, Parquet and a ``datasets`` folder (the same
multi-turn conversations, ``tests/shapes.py``), it measures in the same run, CPU time of this process, cutting into
shards of 1,024 and pickling each shard (what a process pool or ``ray`` does to send it):

* records: every record read and sent as an object (a line, or a row as a Python dict): how a JSON array is still
  sent;
* by reference: what prepare sends for these kinds (a JSONL span with its bytes, as Ray's actors get it; a shard's
  rows as Arrow data), the worker making the records.
"""

from __future__ import annotations

import argparse
import gzip
import importlib
import json
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
from shapes import SHAPES

prepare_module = importlib.import_module("turnkit.data.prepare")  # the module, not the function turnkit.data exports


def _feed(source: Path, by_reference: bool) -> tuple[float, int]:
    """CPU seconds to cut ``source`` into shards and pickle each; bytes sent."""
    start, sent = time.process_time(), 0
    for shard in prepare_module._shards([str(source)], 1024, by_reference=by_reference, carry_data=True):
        sent += len(pickle.dumps(shard))
    return time.process_time() - start, sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="turnkit-feed-"))
    records = next(s for s in SHAPES if s.name == "multi-turn 1-3").records(args.records, seed=3)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    inputs = {
        "JSONL": work / "data.jsonl",
        "gzipped JSONL": work / "data.jsonl.gz",
        "Parquet": work / "data.parquet",
        "datasets folder": work / "data",
    }
    inputs["JSONL"].write_bytes(text)
    inputs["gzipped JSONL"].write_bytes(gzip.compress(text))
    pq.write_table(pa.Table.from_pylist(records), inputs["Parquet"])
    datasets.disable_progress_bars()
    datasets.Dataset.from_list(records).save_to_disk(inputs["datasets folder"])
    n = args.records
    print(f"{n:,} multi-turn conversations, shards of 1,024, medians of {args.repeats} runs (CPU time of this process)")
    for kind, path in inputs.items():
        took: dict[bool, list[float]] = {False: [], True: []}
        sent: dict[bool, int] = {}
        for _ in range(args.repeats):
            for by_reference in (False, True):
                seconds, sent[by_reference] = _feed(path, by_reference)
                took[by_reference].append(seconds)
        objects, reference = statistics.median(took[False]), statistics.median(took[True])
        print(f"{kind:15} records {n / objects:>9,.0f}/s ({sent[False] / n:,.0f} B a record sent), by reference "
              f"{n / reference:>9,.0f}/s ({sent[True] / n:,.0f} B): {objects / reference:.1f}x")  # fmt: skip


if __name__ == "__main__":
    main()
