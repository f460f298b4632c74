"""What ``turnkit prepare`` writes, and reading it back: a shard's Parquet file and its done-file, the manifest and
``rejects.jsonl`` assembled from the done-files, the summary table, the rows of a prepared folder.

A shard is written atomically, its Parquet file first and then ``shard-NNNNN.json`` (its counts and rejects), which
marks it done: a rerun reads the done-files (:func:`finished_summary`) and redoes only what has none. Planning the
shards and running them (locally or on Ray) is :mod:`.prepare`'s.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

from turnkit.cache import atomic_path, write_atomically
from turnkit.data.accounting import ID_FIELD_DEFAULT, duplicate_ids
from turnkit.data.pipeline import PrepareConfig, _format
from turnkit.errors import PrepareError

__all__ = [
    "PARQUET_OPTIONS",
    "ShardWriter",
    "finish",
    "finished_summary",
    "load_rows",
    "report",
    "shard_table",
    "write_shard",
]


_SCHEMA: Any = None
_SCALAR_COLUMNS = ["record_id", "source", "turn", "length"]
# How a shard is encoded. The four token-list columns are nearly all of a shard and of the time writing it takes;
# on them Parquet's dictionary pages (a page's distinct ids) and min/max statistics (which no reader prunes token
# lists by) cost up to a third of a write, and zstd gets the size back: on 512-record shards of the benchmark's data
# shapes writing takes 6-35% less CPU and the files are 8% larger to 32% smaller than with pyarrow's defaults
# (dictionaries and statistics everywhere, snappy; benchmarks/prepare_write.py). The rows are the same.
PARQUET_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "use_dictionary": _SCALAR_COLUMNS,
    "write_statistics": _SCALAR_COLUMNS,
}


def shard_table(rows: list[dict[str, Any]]) -> Any:
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


def write_shard(folder: Path, index: int, table: Any, summary: dict[str, Any]) -> None:
    """The shard's Parquet file, then its done-file: both atomic, the done-file last."""
    import pyarrow.parquet as pq

    shard = folder / f"shard-{index:05d}"
    with atomic_path(shard.with_suffix(".parquet")) as scratch:
        pq.write_table(table, scratch, **PARQUET_OPTIONS)
    write_atomically(shard.with_suffix(".json"), json.dumps(summary).encode())


class ShardWriter:
    """Writes the shards this process holds (those of the one local worker, or those Ray's actors return).

    ``threaded``: in a thread, so that the next shard is processed while pyarrow writes this one (it works without
    the GIL): where a core is spare, writing costs no time. At most one shard waits to be written, and each is
    written as :func:`write_shard` does (Parquet, then its done-file), so a killed run resumes as before.
    """

    def __init__(self, folder: Path, *, threaded: bool) -> None:
        self.folder = folder
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="turnkit-write") if threaded else None
        self.pending: Future[None] | None = None

    def write(self, index: int, table: Any, summary: dict[str, Any]) -> None:
        if self.pool is None:
            write_shard(self.folder, index, table, summary)
            return
        self.wait()
        self.pending = self.pool.submit(write_shard, self.folder, index, table, summary)

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


def finished_summary(folder: Path, index: int, fingerprint: str) -> dict[str, Any] | None:
    """The summary of a shard a previous run finished, or None."""
    done_file = folder / f"shard-{index:05d}.json"
    if not done_file.is_file():
        return None
    summary = json.loads(done_file.read_text())
    if summary.get("config") != fingerprint:
        raise PrepareError(f"{folder} holds shards made with other options; use another --out, or delete it")
    return summary


def finish(
    out: Path, folder: Path, sources: list[str], config: PrepareConfig, runner: str, workers: int, run: dict[str, Any]
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
            "ids_from_source",
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
        # how many records are named by where they were read, having no id of their own: such an id changes when the
        # inputs are reordered, split or filtered, so a trainer's log or a reject found by it may name another record
        "record_ids": {
            "own": totals["read"] - totals["ids_from_source"],
            "from_source": totals["ids_from_source"],
        },
        "options": config.to_dict(),
        "runner": runner,
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
        *_source_ids_line(manifest.get("record_ids"), manifest["id_field"]),
        f"time               {manifest['seconds']:>11.1f}s",
    ]
    return "\n".join(lines)


def _source_ids_line(record_ids: dict[str, int] | None, id_field: str) -> list[str]:
    """Records named by where they were read (``file:line``), having no id field: counted, so it is said."""
    if not record_ids or not record_ids.get("from_source"):
        return []
    field = id_field.split()[0]
    return [
        f"ids from source    {record_ids['from_source']:>12,}   records have no {field!r} field: each is named by "
        "where it was read (file:line)"
    ]


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
