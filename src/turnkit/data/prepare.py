"""``turnkit prepare``: datasets to tokenized Parquet shards, every record accounted for, locally or on Ray.

The input records are cut into shards of ``shard_records`` in read order. Each shard is processed by
:func:`~turnkit.data.pipeline.process_records` and written atomically: ``shards/shard-NNNNN.parquet`` first (through a
temporary name), then ``shard-NNNNN.json`` with the shard's counts and rejects, which marks it done. A rerun after a
crash skips the shards that are done and redoes the rest, so the final output equals an uninterrupted run's. At the
end ``manifest.json`` (counts, token totals, fingerprints, options, version) and ``rejects.jsonl`` are assembled from
the shard files. Written plus rejected always equals read.

The input is read as a stream: at most two shards per worker are in flight, so memory stays flat whatever the input
size. The local engine runs shards in worker processes; the Ray engine runs the same function in Ray actors (on a
private instance, or on an existing cluster with ``ray_address``) and the driver writes what they return, so the
shards and counts are the local engine's. Local worker processes make the records of JSONL, Parquet and ``datasets``
inputs themselves: this process only counts lines to find where each shard's lie
(:class:`~turnkit.data.sources.JsonlSpan`), and sends a few numbers a shard, not its text (the text's bytes in one
buffer for a compressed file); or decodes a shard's rows and sends them as Arrow data
(:class:`~turnkit.data.sources.RowSlice`), not as Python objects.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import lru_cache
from itertools import islice
from pathlib import Path
from typing import Any

from turnkit.cache import atomic_path, write_atomically
from turnkit.collector import FEWER_COLLECTIONS, fewer_collections
from turnkit.data.accounting import ID_FIELD_DEFAULT, duplicate_ids
from turnkit.data.pipeline import PrepareConfig, _format, process_records
from turnkit.data.sources import (
    RawRecord,
    RecordsByReference,
    check_inputs,
    read_records,
    records_of,
    shard_cutter,
)
from turnkit.errors import InputError, PrepareError

__all__ = ["PrepareError", "prepare"]


def _fingerprint(config: PrepareConfig) -> str:
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]


#: A shard as it is handed to whoever processes it: its records, or what a worker makes them from (a span of a JSONL
#: file, rows of a Parquet file or a dataset as Arrow data).
ShardInput = list[RawRecord | RecordsByReference]


def _shards(
    inputs: Sequence[str], size: int, *, by_reference: bool = False, carry_data: bool = False
) -> Iterator[ShardInput]:
    """The inputs' records in shards of ``size``, in read order (a shard may span inputs).

    ``by_reference``: JSONL, Parquet and ``datasets`` inputs are cut into pieces that the worker process makes the
    records of (:func:`shard_cutter`), instead of being read into records here and sent; a shard's records are the same
    either way (:func:`records_of` gives them). ``carry_data``: the pieces hold their data, for workers that may not
    see the input files (Ray actors on other machines).
    """
    chunk: ShardInput = []
    room = size
    for source in inputs:
        cutter = shard_cutter(source, carry_data=carry_data) if by_reference else None
        if cutter is not None:
            try:
                while piece := cutter.take(room):
                    chunk.append(piece)
                    room -= piece.count
                    if room == 0:
                        yield chunk
                        chunk, room = [], size
            finally:
                cutter.close()
            continue
        records = read_records(source)
        while part := list(islice(records, room)):
            chunk.extend(part)
            room -= len(part)
            if room == 0:
                yield chunk
                chunk, room = [], size
    if chunk:
        yield chunk


_SCHEMA: Any = None
_SCALAR_COLUMNS = ["record_id", "source", "turn", "length"]
# How a shard is encoded. The four token-list columns are nearly all of a shard and of the time writing it takes;
# on them Parquet's dictionary pages (a page's distinct ids) and min/max statistics (which no reader prunes token
# lists by) cost up to a third of a write, and zstd gets the size back: on 512-record shards of the benchmark's data
# shapes writing takes 6-35% less CPU and the files are 8% larger to 32% smaller than with pyarrow's defaults
# (dictionaries and statistics everywhere, snappy; benchmarks/prepare_write.py). The rows are the same.
_PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": _SCALAR_COLUMNS,
    "write_statistics": _SCALAR_COLUMNS,
}


def _table(rows: list[dict[str, Any]]) -> Any:
    """The rows as an Arrow table, built column by column from numpy arrays (``from_pylist`` is ~40x slower)."""
    import numpy as np
    import pyarrow as pa

    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = pa.schema(
            [
                ("record_id", pa.string()),
                ("source", pa.string()),
                ("turn", pa.int32()),
                ("input_ids", pa.list_(pa.int32())),
                ("labels", pa.list_(pa.int32())),
                ("assistant_masks", pa.list_(pa.int8())),
                ("completion_mask", pa.list_(pa.int8())),
                ("length", pa.int32()),
            ]
        )
    lengths = np.array([len(r["input_ids"]) for r in rows], dtype=np.int32)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))

    def lists(key: str, dtype: Any) -> Any:
        values = np.concatenate([r[key] for r in rows]).astype(dtype, copy=False) if rows else np.array([], dtype)
        return pa.ListArray.from_arrays(offsets, pa.array(values))

    masks = lists("assistant_masks", np.int8)
    columns = [
        pa.array([r["record_id"] for r in rows], pa.string()),
        pa.array([r["source"] for r in rows], pa.string()),
        pa.array([r["turn"] for r in rows], pa.int32()),
        lists("input_ids", np.int32),
        lists("labels", np.int32),
        masks,
        masks,
        pa.array(lengths),
    ]
    return pa.Table.from_arrays(columns, schema=_SCHEMA)


def _summary(index: int, config: PrepareConfig, result: Any) -> dict[str, Any]:
    return {"shard": index, "config": _fingerprint(config), **result.summary(), "rejects": result.rejects}


def _write_shard(folder: Path, index: int, table: Any, summary: dict[str, Any]) -> None:
    """The shard's Parquet file, then its done-file: both atomic, the done-file last."""
    import pyarrow.parquet as pq

    shard = folder / f"shard-{index:05d}"
    with atomic_path(shard.with_suffix(".parquet")) as scratch:
        pq.write_table(table, scratch, **_PARQUET_OPTIONS)
    write_atomically(shard.with_suffix(".json"), json.dumps(summary).encode())


def _process_shard(
    index: int, shard: ShardInput, config: PrepareConfig, spare_core: bool
) -> tuple[Any, dict[str, Any]]:
    """One shard's Arrow table and summary."""
    result = process_records(records_of(shard), config, spare_core=spare_core)
    return _table(result.rows), _summary(index, config, result)


def run_shard(
    index: int, shard: ShardInput, config: PrepareConfig, folder: str, spare_core: bool = True
) -> dict[str, Any]:
    """Process one shard and write it (Parquet, then its done-file). Returns the shard's summary."""
    table, summary = _process_shard(index, shard, config, spare_core)
    _write_shard(Path(folder), index, table, summary)
    return summary


class _ShardWriter:
    """Writes the shards this process holds (those of the one local worker, or those Ray's actors return).

    ``threaded``: in a thread, so that the next shard is processed while pyarrow writes this one (it works without
    the GIL): where a core is spare, writing costs no time. At most one shard waits to be written, and each is
    written as :func:`_write_shard` does (Parquet, then its done-file), so a killed run resumes as before.
    """

    def __init__(self, folder: Path, *, threaded: bool) -> None:
        self.folder = folder
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkit-write") if threaded else None
        self.pending: Future[None] | None = None

    def write(self, index: int, table: Any, summary: dict[str, Any]) -> None:
        if self.pool is None:
            _write_shard(self.folder, index, table, summary)
            return
        self.wait()
        self.pending = self.pool.submit(_write_shard, self.folder, index, table, summary)

    def wait(self) -> None:
        """Until the shard being written is written; raises what writing it raised."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self.pool is not None:
                self.pool.shutdown()


def _worker_init() -> None:
    import pyarrow as pa

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    # Arrow's default allocator (mimalloc) pays for the arenas a forked process inherited on its first tables: a
    # worker's first shard took 90-120 ms to write instead of 20 (3,500 page faults). The C allocator has no such start.
    pa.set_memory_pool(pa.system_memory_pool())
    # A worker process is ours: what it inherited (the loaded format, the libraries) is never garbage, so the
    # collector stops scanning it, and runs less often (turnkit.collector).
    gc.freeze()
    gc.set_threshold(FEWER_COLLECTIONS, *gc.get_threshold()[1:])


class _Progress:
    """A tqdm bar on a terminal (records, records/s, tokens); nothing elsewhere or without tqdm."""

    def __init__(self, enabled: bool) -> None:
        self.start = time.perf_counter()
        self.tokens = 0
        self.shards = 0  # shards of the input, and how many of them an earlier run had finished
        self.resumed = 0
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(desc="turnkit prepare", unit=" records", unit_scale=True, dynamic_ncols=True)

    def update(self, summary: dict[str, Any], *, resumed: bool = False) -> None:
        self.shards += 1
        self.resumed += resumed
        self.tokens += summary["tokens"]
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens:,} tokens ({self.tokens / elapsed:,.0f}/s)", refresh=False)
            self.bar.update(summary["read"])

    def done(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _done(folder: Path, index: int, fingerprint: str) -> dict[str, Any] | None:
    """The summary of a shard a previous run finished, or None."""
    done_file = folder / f"shard-{index:05d}.json"
    if not done_file.is_file():
        return None
    summary = json.loads(done_file.read_text())
    if summary.get("config") != fingerprint:
        raise PrepareError(f"{folder} holds shards made with other options; use another --out, or delete it")
    return summary


def _undone_shards(
    inputs: Sequence[str],
    size: int,
    folder: Path,
    fingerprint: str,
    progress: _Progress,
    *,
    by_reference: bool = False,
    carry_data: bool = False,
) -> Iterator[tuple[int, ShardInput]]:
    """The shards still to do, with their index; a shard a previous run finished only counts in the progress."""
    for index, shard in enumerate(_shards(inputs, size, by_reference=by_reference, carry_data=carry_data)):
        summary = _done(folder, index, fingerprint)
        if summary is None:
            yield index, shard
        else:
            progress.update(summary, resumed=True)


def _local(inputs: Sequence[str], folder: Path, config: PrepareConfig, workers: int, size: int, progress: _Progress):
    fingerprint = _fingerprint(config)
    pending: set[Future[dict[str, Any]]] = set()
    if workers > 1:
        # load the format and its tokenizer paths once, before the workers fork: they start with them loaded
        _format(config.model).tokenizer.data  # noqa: B018 - a cached property, built here
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) if workers > 1 else None
    spare_core = workers < (os.cpu_count() or 1)  # else a thread of each worker only adds contention
    writer = _ShardWriter(folder, threaded=spare_core)  # writes the shards of one worker (this process)
    try:
        # worker processes read plain JSONL themselves: this process only finds where each shard's lines lie
        shards = _undone_shards(inputs, size, folder, fingerprint, progress, by_reference=pool is not None)
        for index, shard in shards:
            if pool is None:
                table, summary = _process_shard(index, shard, config, spare_core)
                writer.write(index, table, summary)
                progress.update(summary)
                continue
            pending.add(pool.submit(run_shard, index, shard, config, str(folder), spare_core))
            while len(pending) >= 2 * workers:  # bounded: the input streams, memory stays flat
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    progress.update(future.result())
        for future in pending:
            progress.update(future.result())
    finally:
        writer.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)


class _ShardWorker:
    """A Ray actor: processes shards and returns each as an Arrow table with its summary; the driver writes them, so
    the output folder need only exist where the driver runs, whatever node did the work."""

    def __init__(self, config: PrepareConfig) -> None:
        _worker_init()
        self.config = config

    def run(self, index: int, records: ShardInput) -> tuple[int, Any, dict[str, Any]]:
        import ray

        table, summary = _process_shard(index, records, self.config, spare_core=False)  # the actor reserved one CPU
        summary["ray_node"] = ray.get_runtime_context().get_node_id()  # where it ran (not in the manifest's totals)
        return index, table, summary


def _ray(
    inputs: Sequence[str],
    folder: Path,
    config: PrepareConfig,
    workers: int,
    size: int,
    progress: _Progress,
    address: str | None = None,
):
    import ray
    from ray.util import ActorPool

    connected = False  # by this call: then it disconnects (and a local instance it started stops) when done
    if not ray.is_initialized():
        connected = True
        if address:  # an existing cluster: its own resources; turnkit must be importable on its nodes
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            # "local" starts a private instance: without it ray.init joins any cluster left on this machine (or named
            # by RAY_ADDRESS), where num_cpus is refused and the run would share someone else's workers.
            ray.init(
                address="local",
                num_cpus=workers,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
    actors = [ray.remote(num_cpus=1)(_ShardWorker).remote(config) for _ in range(workers)]
    pool = ActorPool(actors)
    fingerprint = _fingerprint(config)
    in_flight = 0
    writer = _ShardWriter(folder, threaded=True)  # the driver waits for the next shard while it writes one

    def collect() -> None:
        index, table, summary = pool.get_next_unordered()
        writer.write(index, table, summary)
        progress.update(summary)

    try:
        # the actors make the records of JSONL, Parquet and datasets inputs from their bytes: the driver, which feeds
        # every actor of a cluster, only cuts the input (a buffer a shard, not a record object a line)
        shards = _undone_shards(inputs, size, folder, fingerprint, progress, by_reference=True, carry_data=True)
        for index, records in shards:
            pool.submit(lambda actor, job: actor.run.remote(*job), (index, records))
            in_flight += 1
            while in_flight >= 2 * workers:  # bounded, as the local engine
                collect()
                in_flight -= 1
        while pool.has_next():
            collect()
    finally:
        writer.close()
        for actor in actors:
            ray.kill(actor)  # type: ignore[arg-type]  # ray types a remote class and its handle alike
        if connected:
            ray.shutdown()


def prepare(
    inputs: Sequence[str | Path],
    out: str | Path,
    config: PrepareConfig,
    *,
    workers: int = 1,
    engine: str = "local",
    shard_records: int = 1024,
    progress: bool = True,
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Prepare ``inputs`` into ``out``; returns the manifest (also written to ``out/manifest.json``).

    ``ray_address`` (engine ``ray``) runs on an existing Ray cluster (``ray start --head`` ...); without it, a private
    Ray instance with ``workers`` CPUs is started on this machine.
    """
    out = Path(out)
    folder = out / "shards"
    sources = [str(i) for i in inputs]
    _check_options(out, config, workers, engine, shard_records, ray_address)
    _check_named_once(sources)
    try:
        check_inputs(sources)  # a missing input, or an unreachable hub, fails before any work
    except InputError as exc:
        raise PrepareError(str(exc)) from None
    meter = _Progress(progress)
    with _removed_if_nothing_done(out), fewer_collections():  # this process reads every record
        folder.mkdir(parents=True, exist_ok=True)
        if engine == "local":
            _local(sources, folder, config, workers, shard_records, meter)
        else:
            _ray(sources, folder, config, workers, shard_records, meter, ray_address)
    meter.done()
    run = {"shards": meter.shards, "resumed": meter.resumed, "seconds": round(time.perf_counter() - meter.start, 2)}
    return _finish(out, folder, sources, config, engine, workers, run)


def _check_options(
    out: Path, config: PrepareConfig, workers: int, engine: str, shard_records: int, ray_address: str | None
) -> None:
    """Options that cannot work, refused before anything is read or written."""
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out {out} is a file: give a folder (it receives manifest.json, rejects.jsonl, shards/)")
    if config.max_length is not None and config.max_length < 1:
        raise PrepareError(f"--max-length must be at least 1 token, not {config.max_length}")
    if workers < 1:
        raise PrepareError(f"--workers must be at least 1, not {workers}")
    if shard_records < 1:
        raise PrepareError(f"--shard-records must be at least 1, not {shard_records}")
    if ray_address and engine != "ray":
        raise PrepareError("--ray-address goes with --engine ray")
    if engine not in ("local", "ray"):
        raise PrepareError(f"unknown engine {engine!r}: use 'local' or 'ray'")


def _check_named_once(sources: Sequence[str]) -> None:
    """An input named twice (``a.jsonl ./a.jsonl``) would have every record written twice, under the same ids."""
    seen: dict[str, str] = {}
    for source in sources:
        key = source if source.startswith("hub:") else str(Path(source).resolve())
        if key in seen:
            also = "" if seen[key] == source else f" (as {seen[key]} and {source})"
            raise PrepareError(f"input {source} is named twice{also}: each of its records would be written twice")
        seen[key] = source


@contextmanager
def _removed_if_nothing_done(out: Path) -> Iterator[None]:
    """On failure, remove what this run created when no shard was finished: a failed first run leaves no empty
    folders behind, and a resumable one keeps its shards."""
    created = [p for p in (out, out / "shards") if not p.exists()]
    try:
        yield
    except BaseException:
        shards = out / "shards"
        if not (shards.is_dir() and any(shards.glob("shard-*.json"))):
            for path in reversed(created):
                shutil.rmtree(path, ignore_errors=True)
        raise


def _finish(
    out: Path, folder: Path, sources: list[str], config: PrepareConfig, engine: str, workers: int, run: dict[str, Any]
) -> dict[str, Any]:
    """Assemble ``manifest.json`` and ``rejects.jsonl`` from the shards' done-files. ``run``: this run's shard count,
    how many of them an earlier run had written (``resumed``; all of them: the run had nothing to do), and seconds."""
    from turnkit import __version__

    summaries = sorted((json.loads(p.read_text()) for p in folder.glob("shard-*.json")), key=lambda s: s["shard"])
    totals: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    markers: Counter[str] = Counter()
    rejects: list[dict[str, Any]] = []
    for summary in summaries:
        for key in (
            "read",
            "written",
            "rows",
            "rejected",
            "tokens",
            "trained_tokens",
            "truncated",
            "records_with_markers",
            "reasoning_left_out",
            "records_reasoning_left_out",
        ):
            totals[key] += summary.get(key, 0)  # a shard an older version wrote lacks the newer counts
        reasons.update(summary["rejected_by_reason"])
        markers.update(summary["markers"])
        rejects.extend(summary["rejects"])
    if totals["written"] + totals["rejected"] != totals["read"]:  # pragma: no cover - an invariant, checked anyway
        raise PrepareError(f"internal check failed: written + rejected != read ({dict(totals)})")
    fmt = _format(config.model)
    template_sha256, tokenizer_sha256 = _fingerprints(config.model)
    files = sorted(p.relative_to(out).as_posix() for p in (out / "shards").rglob("*.parquet"))
    manifest = {
        "turnkit_version": __version__,
        "inputs": sources,
        "counts": {
            **{k: totals[k] for k in ("read", "written", "rejected", "rows")},
            "rejected_by_reason": dict(reasons),
        },
        "tokens": totals["tokens"],
        "trained_tokens": totals["trained_tokens"],
        "truncated": totals["truncated"],
        "markers_found": dict(markers),
        "records_with_markers": totals["records_with_markers"],
        "reasoning_left_out": {
            "turns": totals["reasoning_left_out"],
            "records": totals["records_reasoning_left_out"],
        },
        "template_sha256": template_sha256,
        "tokenizer_sha256": tokenizer_sha256,
        "tokenizer_path": fmt.tokenizer.tokenizer_path,
        "id_field": config.id_field or f"{ID_FIELD_DEFAULT} (where present, else the source file:line)",
        "options": config.to_dict(),
        "engine": engine,
        "workers": workers,
        "seconds": run["seconds"],
        "shards": {"total": run["shards"], "resumed": run["resumed"]},
        "duplicate_ids": duplicate_ids(out / name for name in files),
        "files": files,
    }
    write_atomically(out / "rejects.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects).encode())
    write_atomically(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False).encode())
    return manifest


@lru_cache(maxsize=4)
def _fingerprints(model: str) -> tuple[str, str]:
    """The SHA-256 of the format's templates and of its tokenizer's definition (a tokenizer's JSON is megabytes: it
    is hashed once a process, as the format is loaded once)."""
    fmt = _format(model)
    template_text = "\n".join(fmt.templates.templates[n] for n in fmt.template_names)
    return (
        hashlib.sha256(template_text.encode()).hexdigest(),
        hashlib.sha256(fmt.tokenizer.backend.to_str().encode()).hexdigest(),
    )


def report(manifest: dict[str, Any]) -> str:
    """The summary table printed at the end of a run."""
    counts = manifest["counts"]
    lines = [
        f"records read       {counts['read']:>12,}",
        f"records written    {counts['written']:>12,}   ({counts['rows']:,} rows)",
        f"records rejected   {counts['rejected']:>12,}",
        *(f"  {n:>6,}  {reason}" for reason, n in sorted(counts["rejected_by_reason"].items(), key=lambda x: -x[1])),
        f"tokens             {manifest['tokens']:>12,}",
        f"trained tokens     {manifest['trained_tokens']:>12,}",
        f"truncated records  {manifest['truncated']:>12,}",
        f"records w/ markers {manifest['records_with_markers']:>12,}",
        *(f"  {n:>6,}  {marker}" for marker, n in sorted(manifest["markers_found"].items(), key=lambda x: -x[1])),
        *_reasoning_line(manifest.get("reasoning_left_out")),
        *_duplicates_line(manifest.get("duplicate_ids")),
        f"time               {manifest['seconds']:>11.1f}s",
    ]
    return "\n".join(lines)


def _duplicates_line(duplicates: dict[str, Any] | None) -> list[str]:
    """Written records whose id another written record has too (see :func:`~turnkit.data.accounting.duplicate_ids`)."""
    if not duplicates or not duplicates.get("ids"):
        return []
    first, ids = duplicates["examples"][0], duplicates["ids"]
    return [
        f"duplicate ids      {duplicates['records']:>12,}   records share {ids:,} id{'s' if ids > 1 else ''} (first: "
        f"{first['record_id']!r} at {', '.join(first['sources'])})"
    ]


def _reasoning_line(left_out: dict[str, int] | None) -> list[str]:
    """Reasoning the template left out of assistant turns (allowed: Qwen3 drops it from earlier turns by design)."""
    if not left_out or not left_out.get("turns"):
        return []
    return [
        f"reasoning left out {left_out['turns']:>12,}   turns in {left_out['records']:,} records "
        "(the template drops it there; it is not trained)"
    ]


def load_rows(out: str | Path) -> Iterable[dict[str, Any]]:
    """Every row of a prepared folder (for tests and small inspections)."""
    import pyarrow.parquet as pq

    for path in sorted((Path(out) / "shards").rglob("*.parquet")):
        yield from pq.read_table(path).to_pylist()
