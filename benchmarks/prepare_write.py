"""What writing a shard costs, with turnkit's Parquet encoding against pyarrow's defaults, by data shape.

Usage: python benchmarks/prepare_write.py [--shapes NAME,...] [--shard-records S] [--repeats R]

A shard is four columns of every token (``input_ids``, ``labels`` and the two masks) and four small ones. One worker
writes each shard in a thread of its own while it encodes the next, on the second core where there is one; two workers
on two cores cannot, so what writing costs is what separates them from twice one worker. For each data shape of
``tests/shapes.py``, one shard's table as prepare builds it is written, in turn, with pyarrow's defaults (dictionary
pages and min/max statistics on every column, snappy) and with turnkit's (``_PARQUET_OPTIONS``: zstd, dictionaries and
statistics on the small columns only), and read back; it prints the CPU time of each (medians), the file sizes, and
checks that both files hold the same rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import pyarrow.parquet as pq
from corpus import smollm2_tokenizer_folder
from shapes import SHAPES, model_folder

from turnkit.data import PrepareConfig, output
from turnkit.data.pipeline import process_records
from turnkit.data.sources import RawRecord


def _cpu(action, repeats: int) -> float:
    """Median CPU seconds of ``action()``."""
    took = []
    for _ in range(repeats):
        start = time.process_time()
        action()
        took.append(time.process_time() - start)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser()
    names = ", ".join(s.name for s in SHAPES)
    parser.add_argument("--shapes", help=f"comma-separated shape names (default: all): {names}")
    parser.add_argument(
        "--shard-records", type=int, default=512, help="records in the shard (the benchmark's 8 shards)"
    )
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    wanted = args.shapes.split(",") if args.shapes else [s.name for s in SHAPES]
    work = Path(tempfile.mkdtemp(prefix="turnkit-write-"))
    tokenizer_folder = smollm2_tokenizer_folder()
    encodings = {"pyarrow's defaults": {}, "turnkit's": output.PARQUET_OPTIONS}
    print(f"one shard of {args.shard_records} records a shape, CPU time of this process, medians of {args.repeats}")
    print(f"{'shape':30} {'encoding':19} {'write ms':>8} {'read ms':>8} {'kB':>6}")
    for shape in (s for s in SHAPES if s.name in wanted):
        model = model_folder(shape.model, tokenizer_folder, work / "models")
        records = [RawRecord(f"{i}", data) for i, data in enumerate(shape.records(args.shard_records, seed=1))]
        result = process_records(records, PrepareConfig(model=str(model)))
        table = output.shard_table(result.rows)
        written: dict[str, tuple[float, float, int]] = {}
        for name, options in encodings.items():
            path = work / f"{name[:7]}.parquet"
            write = _cpu(lambda: pq.write_table(table, path, **options), args.repeats)  # noqa: B023 - run at once
            read = _cpu(lambda: pq.read_table(path), args.repeats)  # noqa: B023
            assert pq.read_table(path).equals(table), f"{shape.name}: {name} encoding reads back other rows"
            written[name] = (write, read, path.stat().st_size)
            print(f"{shape.name:30} {name:19} {write * 1000:8.1f} {read * 1000:8.1f} {path.stat().st_size / 1e3:6.0f}")
        (write_0, read_0, size_0), (write_1, read_1, size_1) = written.values()
        print(
            f"{'':30} {'turnkit / pyarrow':19} {write_1 / write_0:8.2f} {read_1 / read_0:8.2f} {size_1 / size_0:6.2f}"
        )


if __name__ == "__main__":
    main()
