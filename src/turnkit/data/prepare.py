"""``turnkit prepare``: datasets to tokenized Parquet shards, every record accounted for, locally or on Ray.

The input records are cut into shards of ``shard_records`` in read order. Each shard is processed by
:func:`~turnkit.data.pipeline.process_records` and written atomically: ``shards/shard-NNNNN.parquet`` first (through a
temporary name), then ``shard-NNNNN.json`` with the shard's counts and rejects, which marks it done. A rerun after a
crash skips the shards that are done and redoes the rest, so the final output equals an uninterrupted run's. At the
end ``manifest.json`` (counts, token totals, fingerprints, options, version) and ``rejects.jsonl`` are assembled from
the shard files. Written plus rejected always equals read.

The local engine runs shards in worker processes; the Ray engine runs the same function with Ray Data
(``from_items``, ``map_batches``, ``write_parquet``), so a cluster scales it out.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict
from itertools import islice
from pathlib import Path
from typing import Any

from turnkit.data.pipeline import PrepareConfig, _format, process_records
from turnkit.data.sources import RawRecord, read_records
from turnkit.errors import PrepareError

__all__ = ["PrepareError", "prepare"]


def _fingerprint(config: PrepareConfig) -> str:
    return hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def _shards(inputs: Sequence[str], size: int) -> Iterator[list[RawRecord]]:
    def records() -> Iterator[RawRecord]:
        for source in inputs:
            yield from read_records(source)

    stream = records()
    while chunk := list(islice(stream, size)):
        yield chunk


_SCHEMA: Any = None


def _table(rows: list[dict[str, Any]]) -> Any:
    """The rows as an Arrow table, built column by column from numpy arrays (``from_pylist`` is ~40x slower)."""
    import numpy as np
    import pyarrow as pa

    global _SCHEMA
    if _SCHEMA is None:
        _SCHEMA = pa.schema(
            [
                ("record_id", pa.string()),
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
        values = np.concatenate([np.asarray(r[key], dtype=dtype) for r in rows]) if rows else np.array([], dtype)
        return pa.ListArray.from_arrays(offsets, pa.array(values))

    masks = lists("assistant_masks", np.int8)
    columns = [
        pa.array([r["record_id"] for r in rows], pa.string()),
        pa.array([r["turn"] for r in rows], pa.int32()),
        lists("input_ids", np.int32),
        lists("labels", np.int32),
        masks,
        masks,
        pa.array(lengths),
    ]
    return pa.Table.from_arrays(columns, schema=_SCHEMA)


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def run_shard(index: int, records: list[RawRecord], config: PrepareConfig, folder: str) -> dict[str, Any]:
    """Process one shard and write it (Parquet, then its done-file). Returns the shard's summary."""
    import pyarrow.parquet as pq

    result = process_records(records, config)
    shard = Path(folder) / f"shard-{index:05d}"
    partial = shard.with_name(shard.name + ".parquet.partial")
    pq.write_table(_table(result.rows), partial)
    os.replace(partial, shard.with_suffix(".parquet"))
    summary = {"shard": index, "config": _fingerprint(config), **result.summary(), "rejects": result.rejects}
    _write_atomically(shard.with_suffix(".json"), json.dumps(summary).encode())
    return summary


def _worker_init() -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


class _Progress:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.records = self.tokens = 0

    def update(self, summary: dict[str, Any]) -> None:
        self.records += summary["read"]
        self.tokens += summary["tokens"]
        if self.enabled:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            sys.stderr.write(
                f"\rturnkit prepare: {self.records:,} records ({self.records / elapsed:,.0f}/s), "
                f"{self.tokens:,} tokens ({self.tokens / elapsed:,.0f}/s)"
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _local(inputs: Sequence[str], folder: Path, config: PrepareConfig, workers: int, size: int, progress: _Progress):
    fingerprint = _fingerprint(config)
    pending: set[Future[dict[str, Any]]] = set()
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) if workers > 1 else None
    try:
        for index, records in enumerate(_shards(inputs, size)):
            done_file = folder / f"shard-{index:05d}.json"
            if done_file.is_file():
                summary = json.loads(done_file.read_text())
                if summary.get("config") != fingerprint:
                    raise PrepareError(
                        f"{folder} holds shards made with other options; use another --out, or delete it"
                    )
                progress.update(summary)
                continue
            if pool is None:
                progress.update(run_shard(index, records, config, str(folder)))
                continue
            pending.add(pool.submit(run_shard, index, records, config, str(folder)))
            while len(pending) >= 2 * workers:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    progress.update(future.result())
        for future in pending:
            progress.update(future.result())
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


class _RayShards:
    """The Ray Data stage: one batch is one shard; it returns the shard's rows and, in a side column, its summary."""

    def __init__(self, config: PrepareConfig) -> None:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.config = config

    def __call__(self, batch: dict[str, Any]) -> Any:
        import pyarrow as pa

        tables = []
        for index, payload in zip(batch["shard"], batch["records"], strict=True):
            records = [RawRecord(**item) for item in json.loads(payload)]
            result = process_records(records, self.config)
            summary = {
                "shard": int(index),
                "config": _fingerprint(self.config),
                **result.summary(),
                "rejects": result.rejects,
            }
            table = _table(result.rows)
            # the summary rides along on every row, and on one empty row when the shard has none
            if table.num_rows == 0:
                empty = {"record_id": None, "turn": None, "input_ids": [], "labels": [], "assistant_masks": []}
                table = _table([empty])
            column = pa.array([json.dumps(summary)] + [None] * (table.num_rows - 1), pa.string())
            tables.append(table.append_column("shard_summary", column))
        return pa.concat_tables(tables)


def _ray(inputs: Sequence[str], folder: Path, config: PrepareConfig, workers: int, size: int, progress: _Progress):
    import ray

    if not ray.is_initialized():
        # "local" starts a private instance: without it ray.init joins any cluster left on this machine (or named by
        # RAY_ADDRESS), where num_cpus is refused and the run would share someone else's workers.
        ray.init(
            address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False, configure_logging=False
        )
    items = [
        {"shard": index, "records": json.dumps([asdict(r) for r in records])}
        for index, records in enumerate(_shards(inputs, size))
    ]
    if not items:
        return
    dataset = ray.data.from_items(items, override_num_blocks=len(items))
    processed = dataset.map_batches(
        _RayShards,
        fn_constructor_kwargs={"config": config},
        batch_size=1,
        concurrency=workers,
        batch_format="numpy",
    ).materialize()
    column = processed.select_columns(["shard_summary"]).to_arrow_refs()
    import pyarrow as pa

    values = pa.concat_tables(ray.get(column)).column("shard_summary").to_pylist()
    summaries = [json.loads(s) for s in values if s]
    rows = processed.filter(lambda row: row["record_id"] is not None).drop_columns(["shard_summary"])
    rows.write_parquet(str(folder / "ray"))
    for summary in sorted(summaries, key=lambda s: s["shard"]):
        _write_atomically(folder / f"shard-{summary['shard']:05d}.json", json.dumps(summary).encode())
        progress.update(summary)


def prepare(
    inputs: Sequence[str | Path],
    out: str | Path,
    config: PrepareConfig,
    *,
    workers: int = 1,
    engine: str = "local",
    shard_records: int = 1024,
    progress: bool = True,
) -> dict[str, Any]:
    """Prepare ``inputs`` into ``out``; returns the manifest (also written to ``out/manifest.json``)."""
    out = Path(out)
    folder = out / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    sources = [str(i) for i in inputs]
    for source in sources:  # fail on a missing input before any work
        if not source.startswith("hub:") and not Path(source).exists():
            raise PrepareError(f"{source} does not exist")
    meter = _Progress(progress)
    if engine == "local":
        _local(sources, folder, config, workers, shard_records, meter)
    elif engine == "ray":
        _ray(sources, folder, config, workers, shard_records, meter)
    else:
        raise PrepareError(f"unknown engine {engine!r}: use 'local' or 'ray'")
    meter.done()
    return _finish(out, folder, sources, config, engine, workers, time.perf_counter() - meter.start)


def _finish(
    out: Path, folder: Path, sources: list[str], config: PrepareConfig, engine: str, workers: int, seconds: float
) -> dict[str, Any]:
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
        ):
            totals[key] += summary[key]
        reasons.update(summary["rejected_by_reason"])
        markers.update(summary["markers"])
        rejects.extend(summary["rejects"])
    if totals["written"] + totals["rejected"] != totals["read"]:  # pragma: no cover - an invariant, checked anyway
        raise PrepareError(f"internal check failed: written + rejected != read ({dict(totals)})")
    fmt = _format(config.model)
    template_text = "\n".join(fmt.templates.templates[n] for n in fmt.template_names)
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
        "template_sha256": hashlib.sha256(template_text.encode()).hexdigest(),
        "tokenizer_sha256": hashlib.sha256(fmt.tokenizer.backend.to_str().encode()).hexdigest(),
        "options": config.to_dict(),
        "engine": engine,
        "workers": workers,
        "seconds": round(seconds, 2),
        "files": files,
    }
    _write_atomically(
        out / "rejects.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rejects).encode()
    )
    _write_atomically(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False).encode())
    return manifest


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
        f"time               {manifest['seconds']:>11.1f}s",
    ]
    return "\n".join(lines)


def load_rows(out: str | Path) -> Iterable[dict[str, Any]]:
    """Every row of a prepared folder (for tests and small inspections)."""
    import pyarrow.parquet as pq

    for path in sorted((Path(out) / "shards").rglob("*.parquet")):
        yield from pq.read_table(path).to_pylist()
