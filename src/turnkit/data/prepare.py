"""``turnkit prepare``: datasets to tokenized Parquet shards, every record accounted for, locally or on Ray.

The input records are cut into shards of ``shard_records`` in read order. Each shard is processed by
:func:`~turnkit.data.pipeline.process_records` and written atomically: ``shards/shard-NNNNN.parquet`` first (through a
temporary name), then ``shard-NNNNN.json`` with the shard's counts and rejects, which marks it done. A rerun after a
crash skips the shards that are done and redoes the rest, so the final output equals an uninterrupted run's. At the
end ``manifest.json`` (counts, token totals, fingerprints, options, version) and ``rejects.jsonl`` are assembled from
the shard files. Written plus rejected always equals read.

The input is read as a stream: at most two shards per worker are in flight, so memory stays flat whatever the input
size. The local runner runs shards in worker processes; the Ray runner runs the same function in Ray actors (on a
private instance, or on an existing cluster with ``ray_address``) and the driver writes what they return, so the
shards and counts are the local runner's. Local worker processes make the records of JSONL, Parquet and ``datasets``
inputs themselves: this process only counts lines to find where each shard's lie
(:class:`~turnkit.data.cutting.JsonlSpan`), and sends a few numbers a shard, not its text (the text's bytes in one
buffer for a compressed file); or decodes a shard's rows and sends them as Arrow data
(:class:`~turnkit.data.cutting.RowSlice`), not as Python objects.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

from turnkit.collector import FEWER_COLLECTIONS, fewer_collections
from turnkit.data.cutting import RecordsByReference, records_of, shard_cutter
from turnkit.data.output import ShardWriter, finish, finished_summary, shard_table, write_shard
from turnkit.data.pipeline import PrepareConfig, _format, process_records
from turnkit.data.sources import RawRecord, check_inputs, read_records
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


def _summary(index: int, config: PrepareConfig, result: Any) -> dict[str, Any]:
    return {"shard": index, "config": _fingerprint(config), **result.summary(), "rejects": result.rejects}


def _process_shard(
    index: int, shard: ShardInput, config: PrepareConfig, spare_core: bool
) -> tuple[Any, dict[str, Any]]:
    """One shard's Arrow table and summary."""
    result = process_records(records_of(shard), config, spare_core=spare_core)
    return shard_table(result.rows), _summary(index, config, result)


def run_shard(
    index: int, shard: ShardInput, config: PrepareConfig, folder: str, spare_core: bool = True
) -> dict[str, Any]:
    """Process one shard and write it (Parquet, then its done-file). Returns the shard's summary."""
    table, summary = _process_shard(index, shard, config, spare_core)
    write_shard(Path(folder), index, table, summary)
    return summary


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
        summary = finished_summary(folder, index, fingerprint)
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
    writer = ShardWriter(folder, threaded=spare_core)  # writes the shards of one worker (this process)
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
    writer = ShardWriter(folder, threaded=True)  # the driver waits for the next shard while it writes one

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
            while in_flight >= 2 * workers:  # bounded, as the local runner
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
    runner: str = "local",
    shard_records: int = 1024,
    progress: bool = True,
    ray_address: str | None = None,
    engine: str | None = None,
) -> dict[str, Any]:
    """Prepare ``inputs`` into ``out``; returns the manifest (also written to ``out/manifest.json``).

    ``runner``: ``local`` (worker processes) or ``ray`` (Ray actors). ``ray_address`` (runner ``ray``) runs on an
    existing Ray cluster (``ray start --head`` ...); without it, a private Ray instance with ``workers`` CPUs is started
    on this machine. ``engine``: ``runner``'s old name, still taken (a DeprecationWarning says so): "engine" names the
    serving engines only.
    """
    if engine is not None:
        warnings.warn("prepare(engine=...) is now prepare(runner=...)", DeprecationWarning, stacklevel=2)
        runner = engine
    out = Path(out)
    folder = out / "shards"
    sources = [str(i) for i in inputs]
    _check_options(out, config, workers, runner, shard_records, ray_address)
    _check_named_once(sources)
    try:
        check_inputs(sources)  # a missing input, or an unreachable hub, fails before any work
    except InputError as exc:
        raise PrepareError(str(exc)) from None
    meter = _Progress(progress)
    with _removed_if_nothing_done(out), fewer_collections():  # this process reads every record
        folder.mkdir(parents=True, exist_ok=True)
        if runner == "local":
            _local(sources, folder, config, workers, shard_records, meter)
        else:
            _ray(sources, folder, config, workers, shard_records, meter, ray_address)
    meter.done()
    run = {"shards": meter.shards, "resumed": meter.resumed, "seconds": round(time.perf_counter() - meter.start, 2)}
    return finish(out, folder, sources, config, runner, workers, run)


def _check_options(
    out: Path, config: PrepareConfig, workers: int, runner: str, shard_records: int, ray_address: str | None
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
    if ray_address and runner != "ray":
        raise PrepareError("--ray-address goes with --runner ray")
    if runner not in ("local", "ray"):
        raise PrepareError(f"unknown runner {runner!r}: use 'local' or 'ray'")


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
