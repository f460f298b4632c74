"""Dataset preparation speed on every shape of data, each against ``datasets.map`` and ``fmt.encode`` in the same run.

Usage: python benchmarks/prepare.py [--shapes NAME,...] [--conversations N] [--repeats R] [--shard-records S]
                                    [--scale K] [--scale-shards M] [--input jsonl|parquet]
       python benchmarks/prepare.py --memory 200000 [--memory-workers 2]   (peak RSS instead)

For every shape of ``tests/shapes.py`` (single-turn, multi-turn with 1-3 and 6-10 exchanges, long system prompts, tool
calls and results, ShareGPT input, unicode-heavy text, templates with and without ``{% generation %}`` tags, and the
earlier benchmark's mixed data), each repetition generates N fresh conversations and runs, in an order that rotates:

* ``datasets.map`` + ``apply_chat_template(..., return_assistant_tokens_mask=True)`` in one process (the baseline:
  the shape's template with ``{% generation %}`` tags, which transformers needs to make masks; same text, same ids);
* ``turnkit prepare`` with 1 worker and with 2 workers (N / S shards: 8 by default);
* a loop of ``fmt.encode`` (masks, no attribution: what prepare's rows need) over the already-converted
  conversations, as a user writes it (Python's default garbage collector settings);
* ``fmt.encode_batch`` in batches of 128, the same conversations.

Then, for the workers at scale, ``--scale`` (default 4) times the conversations in ``--scale-shards`` shards (default
32), with 1 and 2 workers in turn: 2 workers / 1 where the start of the worker processes and the last shard's tail
weigh less than on 8 shards, and how many cores one worker keeps busy (CPU time over wall time: it writes Parquet and
tokenizes in threads of its own where a core is spare), which bounds what 2 workers can do on 2 cores: 2 / that.

``--input parquet`` gives prepare the conversations as a Parquet file instead of JSONL (the input kind the hub's
datasets come in).

Per run it prints the ratios of variants measured in that run (so that they stay meaningful while other jobs load the
machine), then medians. The load average is printed before and after each shape. Targets: 1 worker at least 2x
``datasets.map``; prepare's time a token at most 1.2x the ``fmt.encode`` loop's; ``encode_batch`` at least as fast as
the loop; 2 workers at least 1.7x one (on a quiet machine: a busy second core leaves nothing for the second worker).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import smollm2_tokenizer_folder
from shapes import SHAPES, Shape, mixed, model_folder, to_messages

from turnkit.data import PrepareConfig, prepare
from turnkit.data.pipeline import _format

VARIANTS = ("baseline", "prepare 1", "prepare 2", "encode loop", "encode_batch")


def _load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def _baseline(tokenizer, records: list[dict]) -> tuple[float, int]:
    """``datasets.map`` over the records (one JSON column), as a user would write it; seconds and tokens."""
    import datasets

    dataset = datasets.Dataset.from_list([{"record": json.dumps(r)} for r in records])

    def encode(batch):
        out = {"input_ids": [], "assistant_masks": []}
        for text in batch["record"]:
            messages, tools = to_messages(json.loads(text))
            encoded = tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            out["input_ids"].append(encoded["input_ids"])
            out["assistant_masks"].append(encoded["assistant_masks"])
        return out

    start = time.perf_counter()
    mapped = dataset.map(encode, batched=True, batch_size=256, remove_columns=["record"])
    seconds = time.perf_counter() - start
    return seconds, sum(len(ids) for ids in mapped["input_ids"])


def _encode_loop(fmt, conversations: list[tuple[list, list | None]]) -> float:
    start = time.perf_counter()
    for messages, tools in conversations:
        fmt.encode(messages, tools=tools, attribution=False)
    return time.perf_counter() - start


def _encode_batch(fmt, conversations: list[tuple[list, list | None]]) -> float:
    items = [{"messages": m, "tools": t} for m, t in conversations]
    start = time.perf_counter()
    for at in range(0, len(items), 128):
        fmt.encode_batch(items[at : at + 128], attribution=False)
    return time.perf_counter() - start


def _write_input(stem: Path, records: list[dict], kind: str) -> tuple[Path, list[dict]]:
    """The records as prepare's input file (JSONL, or Parquet: one row a record, the columns as ``pyarrow`` infers
    them), and the records as that file holds them (Parquet gives every row all the fields any row has, null where it
    had none: what ``datasets.load_dataset("parquet")`` gives the baseline too)."""
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = stem.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(records), path)
        return path, pq.read_table(path).to_pylist()
    path = stem.with_suffix(".jsonl")
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path, records


def _run_shape(shape: Shape, args: argparse.Namespace, work: Path, tokenizer_folder: Path) -> dict[str, float]:
    from transformers import AutoTokenizer

    model = str(model_folder(shape.model, tokenizer_folder, work / "models"))
    baseline_tokenizer = AutoTokenizer.from_pretrained(model_folder(shape.baseline, tokenizer_folder, work / "models"))
    fmt = _format(model)  # the format prepare's one worker uses: loaded once a process, before anything is timed
    n = args.conversations
    warm = work / "warm.jsonl"
    warm.write_text("".join(json.dumps(r) + "\n" for r in shape.records(20, seed=-1)))
    prepare([str(warm)], work / "warm", PrepareConfig(model=model), progress=False)
    shutil.rmtree(work / "warm")
    print(f"\n== {shape.name} ({shape.model} template; baseline {shape.baseline}), {_load()}", flush=True)
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    ratios: dict[str, list[float]] = {"1/base": [], "2/1": [], "prepare/loop": [], "loop/batch": []}
    tokens = 0
    for repeat in range(args.repeats):
        records = shape.records(n, seed=repeat)  # fresh conversations: no cache carries over from a repetition
        data, records = _write_input(work / f"data-{repeat}", records, args.input)
        conversations = [to_messages(r) for r in records]
        took: dict[str, float] = {}
        order = VARIANTS[repeat % len(VARIANTS) :] + VARIANTS[: repeat % len(VARIANTS)]  # the order rotates
        for variant in order:
            fmt.encoder.segment_cache.clear()  # every variant starts from the same caches
            gc.collect()
            if variant == "baseline":
                took[variant], base_tokens = _baseline(baseline_tokenizer, records)
            elif variant.startswith("prepare"):
                out = work / f"out-{repeat}"
                config = PrepareConfig(model=model)
                start = time.perf_counter()
                workers, size = int(variant.split()[1]), args.shard_records
                manifest = prepare([str(data)], out, config, workers=workers, shard_records=size, progress=False)
                took[variant] = time.perf_counter() - start
                assert manifest["counts"]["written"] == n, manifest["counts"]
                tokens = manifest["tokens"]
                shutil.rmtree(out)
            else:
                run: Callable = _encode_loop if variant == "encode loop" else _encode_batch
                took[variant] = run(fmt, conversations)
        assert base_tokens == tokens, f"the baseline made {base_tokens} tokens and prepare {tokens}"
        for variant, value in took.items():
            seconds[variant].append(value)
        base, one, two = took["baseline"], took["prepare 1"], took["prepare 2"]
        loop, batch = took["encode loop"], took["encode_batch"]
        ratios["1/base"].append(base / one)
        ratios["2/1"].append(one / two)
        ratios["prepare/loop"].append(one / loop)
        ratios["loop/batch"].append(loop / batch)
        print(f"  run {repeat + 1}: baseline {n / base:,.0f}/s, prepare {n / one:,.0f}/s (2 workers {n / two:,.0f}/s), "
              f"encode {n / loop:,.0f}/s, encode_batch {n / batch:,.0f}/s | 1 worker / baseline {base / one:.2f}, "
              f"prepare / encode a token {one / loop:.2f}, encode / batch {loop / batch:.2f}, 2 / 1 {one / two:.2f}",
              flush=True)  # fmt: skip
    med = statistics.median
    ns = {v: med(seconds[v]) / tokens * 1e9 for v in VARIANTS}
    print(f"  {n:,} conversations, {tokens / n:,.0f} tokens each; medians of {args.repeats} runs; {_load()}")
    print("  ns a token: " + ", ".join(f"{v} {ns[v]:,.0f}" for v in VARIANTS))
    scale = _scaling(shape, args, work, model) if args.scale else {}
    return {
        **scale,
        "tokens": tokens / n,
        **{f"ns {v}": ns[v] for v in VARIANTS},
        "records/s baseline": n / med(seconds["baseline"]),
        "records/s prepare 1": n / med(seconds["prepare 1"]),
        **{name: med(values) for name, values in ratios.items()},
    }


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the worker processes of a finished run)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _scaling(shape: Shape, args: argparse.Namespace, work: Path, model: str) -> dict[str, float]:
    """1 and 2 workers on ``scale`` times the conversations in ``scale_shards`` shards: 2 / 1, and the cores one worker
    keeps busy (its CPU time over its wall time), which bounds 2 / 1 on a 2-core machine at 2 / cores."""
    n = args.conversations * args.scale
    size = max(1, n // args.scale_shards)
    two_over_one, cores = [], []
    for repeat in range(args.repeats):
        data, _ = _write_input(work / f"scale-{repeat}", shape.records(n, seed=1000 + repeat), args.input)
        took: dict[int, float] = {}
        for workers in (1, 2) if repeat % 2 == 0 else (2, 1):
            _format(model).encoder.segment_cache.clear()
            gc.collect()
            out = work / f"scale-out-{workers}"
            cpu, start = _cpu_seconds(), time.perf_counter()
            manifest = prepare([str(data)], out, PrepareConfig(model=model), workers=workers, shard_records=size,
                               progress=False)  # fmt: skip
            took[workers] = time.perf_counter() - start
            if workers == 1:
                cores.append((_cpu_seconds() - cpu) / took[1])
            assert manifest["counts"]["written"] == n, manifest["counts"]
            shutil.rmtree(out)
        data.unlink()
        two_over_one.append(took[1] / took[2])
        print(f"  at scale, run {repeat + 1}: {n:,} conversations in {args.scale_shards} shards: 1 worker "
              f"{n / took[1]:,.0f}/s using {cores[-1]:.2f} cores, 2 workers {n / took[2]:,.0f}/s, 2 / 1 "
              f"{two_over_one[-1]:.2f} (at most {2 / cores[-1]:.2f} on 2 cores)", flush=True)  # fmt: skip
    med = statistics.median
    return {"2/1 at scale": med(two_over_one), "cores of 1 worker": med(cores)}


def _memory(work: Path, model: Path, count: int, workers: int) -> None:
    """Peak RSS of ``turnkit prepare`` on ``count`` records, in a fresh process: the main process and its workers."""
    data = work / "memory.jsonl"
    rng = random.Random(12345)
    with data.open("w") as handle:  # streamed: this process stays small (a child inherits its peak RSS on Linux)
        for _ in range(count):
            handle.write(json.dumps(mixed(rng)) + "\n")
    script = (
        "import json, resource, sys\n"
        "from pathlib import Path\n"
        "try:\n"
        "    Path('/proc/self/clear_refs').write_text('5')  # the peak RSS mark starts here, not in the parent\n"
        "except OSError:\n"
        "    pass\n"
        "from turnkit.data import PrepareConfig, prepare\n"
        "m = prepare([sys.argv[1]], sys.argv[2], PrepareConfig(model=sys.argv[3]), workers=int(sys.argv[4]), "
        "progress=False)\n"
        "status = Path('/proc/self/status').read_text() if Path('/proc/self/status').exists() else ''\n"
        "peak = [int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith('VmHWM')]\n"
        "print(json.dumps({'written': m['counts']['written'], 'seconds': m['seconds'], "
        "'main_mib': peak[0] if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "
        "'worker_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n"
    )
    command = [sys.executable, "-c", script, str(data), str(work / "memory-out"), str(model), str(workers)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    size = data.stat().st_size / 2**20
    print(f"{count:,} records ({size:,.0f} MiB of JSONL), {workers} worker(s): {found['written']:,} written in "
          f"{found['seconds']:.0f} s; peak RSS {found['main_mib']:.0f} MiB main process, "
          f"{found['worker_mib']:.0f} MiB largest worker; {_load()}")  # fmt: skip


def _summary(results: dict[str, dict[str, float]], n: int, repeats: int, shard_records: int) -> None:
    print(f"\n{n:,} fresh conversations a run, medians of {repeats} runs, {n // shard_records} shards; {_load()}")
    header = (
        f"{'shape':30} {'tok/rec':>7} {'base/s':>7} {'prep/s':>7} {'1/base':>7} "
        f"{'ns/tok prep':>11} {'ns/tok enc':>10} {'prep/enc':>8} {'enc/batch':>9} {'2/1':>5} {'at scale':>8} "
        f"{'1w cores':>8} {'at most':>7}"
    )
    print(header)
    for name, r in results.items():
        print(f"{name:30} {r['tokens']:>7,.0f} {r['records/s baseline']:>7,.0f} {r['records/s prepare 1']:>7,.0f} "
              f"{r['1/base']:>7.2f} {r['ns prepare 1']:>11,.0f} {r['ns encode loop']:>10,.0f} "
              f"{r['prepare/loop']:>8.2f} {r['loop/batch']:>9.2f} {r['2/1']:>5.2f} "
              + (f"{r['2/1 at scale']:>8.2f} {r['cores of 1 worker']:>8.2f} {2 / r['cores of 1 worker']:>7.2f}"
                 if "2/1 at scale" in r else ""))  # fmt: skip
    print("targets: 1/base >= 2.0; prep/enc <= 1.2 (prepare's time a token over the encode loop's); enc/batch >= 1.0; "
          f"2/1 >= 1.7 on a quiet machine (os.cpu_count() = {os.cpu_count()}); 'at scale': 2/1 on the larger input, "
          "'1w cores': the cores one worker keeps busy, 'at most': 2 / that, the bound of 2/1 on 2 cores")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    names = ", ".join(s.name for s in SHAPES)
    parser.add_argument("--shapes", help=f"comma-separated shape names (default: all): {names}")
    parser.add_argument("--conversations", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each variant, each on fresh data")
    # 8 shards: with fewer shards than workers x 4 the last shard runs alone, which measures the tail, not the
    # per-record work
    parser.add_argument("--shard-records", type=int, help="records a shard (default: conversations / 8)")
    parser.add_argument("--scale", type=int, default=4, help="workers at scale: K x the conversations (0: skip)")
    parser.add_argument("--scale-shards", type=int, default=32, help="workers at scale: in M shards")
    parser.add_argument("--input", choices=("jsonl", "parquet"), default="jsonl", help="prepare's input file kind")
    parser.add_argument("--memory", type=int, metavar="N", help="instead: peak RSS of prepare on N records")
    parser.add_argument("--memory-workers", type=int, default=2)
    args = parser.parse_args()
    args.shard_records = args.shard_records or max(1, args.conversations // 8)
    warnings.simplefilter("ignore")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import datasets

    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix="turnkit-bench-"))
    try:
        tokenizer_folder = smollm2_tokenizer_folder()
        if args.memory:
            model = model_folder("qwen-tagged", tokenizer_folder, work / "models")  # the earlier benchmark's
            _memory(work, model, args.memory, args.memory_workers)
            return
        wanted = args.shapes.split(",") if args.shapes else [s.name for s in SHAPES]
        unknown = set(wanted) - {s.name for s in SHAPES}
        if unknown:
            parser.error(f"unknown shapes {sorted(unknown)}")
        print(f"start: {_load()}; prepare reads {args.input}")
        results = {s.name: _run_shape(s, args, work, tokenizer_folder) for s in SHAPES if s.name in wanted}
        _summary(results, args.conversations, args.repeats, args.shard_records)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
