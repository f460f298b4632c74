"""Prepared training data for ``turnkit doctor --data``: rows of ``input_ids`` and ``labels``, from any pipeline.

Accepted: a ``turnkit prepare`` output folder (``manifest.json`` lists its Parquet shards), any folder of ``.parquet``
/ ``.jsonl`` files, or one such file. Only the ``input_ids`` and ``labels`` columns are needed (``record_id`` names a
row when present, else ``file:row``). Reading stops after ``limit`` rows: the checks report how many they saw.

Raw conversations (the ``messages`` records that ``turnkit prepare`` reads) are the likeliest wrong input: they are
told apart from a broken row, and the error gives the ``turnkit prepare`` command that makes prepared data of them.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from turnkit.doctor.findings import DoctorInputError
from turnkit.doctor.target import JsonFile, read_json_file

__all__ = ["Dataset", "Example", "read_dataset"]

_SUFFIXES = (".parquet", ".jsonl", ".json")

#: The fields a raw record of each format ``turnkit prepare`` reads has (OpenAI, ShareGPT, Alpaca).
_RAW_FIELDS = ("messages", "conversations", "instruction", "output")


@dataclass(frozen=True)
class Example:
    """One training row."""

    record: str
    input_ids: np.ndarray
    labels: np.ndarray


@dataclass
class Dataset:
    """The rows read (at most ``limit``) and whether more were left unread."""

    path: Path
    examples: list[Example] = field(default_factory=list)
    truncated: bool = False
    manifest: JsonFile | None = None

    @property
    def model(self) -> str | None:
        """The model a ``turnkit prepare`` run used, from its manifest."""
        if self.manifest is None:
            return None
        model = (self.manifest.data.get("options") or {}).get("model")
        return model if isinstance(model, str) else None


def _files(path: Path) -> tuple[list[Path], JsonFile | None]:
    if path.is_file():
        if path.suffix.lower() not in _SUFFIXES:
            raise DoctorInputError(f"{path} is not a .parquet, .jsonl or .json file")
        return [path], None
    if not path.is_dir():
        raise DoctorInputError(f"{path} does not exist")
    manifest = read_json_file(path / "manifest.json", "manifest.json") if (path / "manifest.json").is_file() else None
    if manifest is not None and isinstance(manifest.data.get("files"), list):
        files = [path / str(name) for name in manifest.data["files"]]
    else:
        files = sorted(p for p in path.rglob("*") if p.suffix.lower() in (".parquet", ".jsonl") and p.is_file())
    if not files:
        raise DoctorInputError(f"{path} holds no .parquet or .jsonl files")
    return files, manifest


def _raw_records(path: Path, what: str, fields: Collection[str], model: str | None) -> DoctorInputError | None:
    """The error for raw conversation records where prepared rows belong (``what``: the row or file, said to be them),
    or None when ``fields`` are not a raw record's."""
    raw = next((name for name in _RAW_FIELDS if name in fields), None)
    if raw is None or "input_ids" in fields:
        return None
    command = f"turnkit prepare {shlex.quote(str(path))} --model {shlex.quote(model or 'MODEL')} --out DIR"
    return DoctorInputError(
        f"{what} ({raw!r}), not prepared data (input_ids and labels): prepare the conversations "
        f"first ({command}), then audit the result (turnkit doctor --data DIR)"
    )


def _parquet_rows(path: Path, model: str | None) -> Iterator[tuple[str, Any, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DoctorInputError("reading Parquet needs pyarrow (pip install 'turnkit[data]')") from None
    try:
        handle = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for files that are not Parquet
        raise DoctorInputError(f"cannot read {path} as Parquet: {exc}") from None
    names = handle.schema_arrow.names
    missing = [c for c in ("input_ids", "labels") if c not in names]
    if missing:
        raw = _raw_records(path, f"{path} holds raw conversation records", names, model)
        raise raw or DoctorInputError(f"{path} has no {' or '.join(missing)} column (its columns: {', '.join(names)})")
    columns = ["input_ids", "labels", *(["record_id"] if "record_id" in names else [])]
    row = 0
    for batch in handle.iter_batches(columns=columns, batch_size=256):
        data = batch.to_pydict()
        for i in range(batch.num_rows):
            record = data["record_id"][i] if "record_id" in data else f"{path.name}:{row}"
            yield str(record), data["input_ids"][i], data["labels"][i]
            row += 1


def _json_rows(path: Path, model: str | None) -> Iterator[tuple[str, Any, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(f"cannot read {path}: {exc}") from None
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DoctorInputError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
        lines = [(n, row) for n, row in enumerate(rows if isinstance(rows, list) else [rows], start=1)]
    else:
        lines = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                lines.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DoctorInputError(f"{path} line {number} is not valid JSON: {exc.msg}") from None
    for number, row in lines:
        if not isinstance(row, dict) or "input_ids" not in row or "labels" not in row:
            fields = row if isinstance(row, dict) else ()
            raw = _raw_records(path, f"{path} row {number} is a raw conversation record", fields, model)
            raise raw or DoctorInputError(f"{path} row {number} has no input_ids and labels")
        yield str(row.get("record_id") or f"{path.name}:{number}"), row["input_ids"], row["labels"]


def read_dataset(path: str | Path, *, limit: int, model: str | None = None) -> Dataset:
    """Up to ``limit`` rows of prepared data; :class:`DoctorInputError` naming the file on unreadable input (``model``:
    the one named on the command line, for the ``turnkit prepare`` command that raw conversations are pointed to)."""
    path = Path(path)
    files, manifest = _files(path)
    dataset = Dataset(path, manifest=manifest)
    for file in files:
        if not file.is_file():
            raise DoctorInputError(f"{file} (listed in {path / 'manifest.json'}) does not exist")
        rows = _parquet_rows(file, model) if file.suffix.lower() == ".parquet" else _json_rows(file, model)
        for record, input_ids, labels in rows:
            if len(dataset.examples) >= limit:
                dataset.truncated = True
                return dataset
            ids, targets = np.asarray(input_ids, dtype=np.int64), np.asarray(labels, dtype=np.int64)
            if ids.shape != targets.shape or ids.ndim != 1:
                raise DoctorInputError(f"{file} record {record}: input_ids and labels differ in length")
            dataset.examples.append(Example(record, ids, targets))
    return dataset
