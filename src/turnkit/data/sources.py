"""Reading training data: JSONL (plain, gzip, zstd), JSON arrays, Parquet, ``datasets`` folders and hub names.

This is the one reader of every input kind. Cutting an input into pieces that worker processes make the records of
themselves is :mod:`.cutting`'s; it gives exactly the records read here.

Every record gets a stable id (``<input>:<line or row>``) so that a rejected record can be found again, and so that a
rerun after a crash lines up with the first run. A line that is not valid JSON is not an exception: it is a
:class:`RawRecord` carrying its error, and ends up in ``rejects.jsonl`` with the line number.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from turnkit.errors import InputError

__all__ = [
    "PARQUET_BATCH",
    "TEXT_ENCODING",
    "TEXT_ERRORS",
    "InputError",
    "RawRecord",
    "check_inputs",
    "datasets_parts",
    "is_datasets_folder",
    "is_jsonl",
    "jsonl_lines",
    "load_hub",
    "open_binary",
    "read_records",
    "rows_as_records",
    "without_compression",
]

#: How long the hub may take to answer before a ``hub:`` input is reported unreachable (instead of ~30 s of retries).
_HUB_PROBE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class RawRecord:
    """One input record: its id, and either its data or why it could not be read.

    A JSONL record travels as its line (``text``, with its ``line`` number) and is parsed by :meth:`read` where it
    is processed: a worker process, not the process that reads the input (a line costs nothing to send; a parsed
    record costs a pickle and an unpickle).
    """

    record_id: str
    data: Any = None
    error: str | None = None
    field: str | None = None
    text: str | None = None
    line: int = 0

    def read(self) -> tuple[Any, str | None, str | None]:
        """The record's data (its line parsed), or why it cannot be read and the field that says so."""
        if self.text is None:
            return self.data, self.error, self.field
        if not self.text.isascii():
            try:
                self.text.encode("utf-8")
            except UnicodeEncodeError as exc:  # a byte the file's UTF-8 did not decode (kept as a surrogate escape)
                byte = self.text[exc.start].encode("utf-8", "surrogateescape")[0]
                return (
                    None,
                    f"line {self.line} is not valid UTF-8: byte 0x{byte:02x} at character {exc.start + 1}",
                    "line",
                )
        try:
            return json.loads(self.text), None, None
        except ValueError as exc:
            return None, f"line {self.line} is not valid JSON: {exc}", "line"


#: UTF-8, where a byte order mark that starts a file (Windows editors write one) is not part of its first record.
#: Bytes that are not UTF-8 are kept as surrogate escapes: the record that holds them is rejected, not the whole input.
TEXT_ENCODING = "utf-8-sig"
TEXT_ERRORS = "surrogateescape"


def open_binary(path: Path) -> BinaryIO:
    """A JSONL input's bytes, decompressed."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if name.endswith(".zst") or name.endswith(".zstd"):
        import zstandard

        stream = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), closefd=True)
        return io.BufferedReader(stream)  # type: ignore[arg-type,return-value]
    return path.open("rb")


def _open_text(path: Path) -> io.TextIOBase:
    return io.TextIOWrapper(open_binary(path), encoding=TEXT_ENCODING, errors=TEXT_ERRORS)


def _jsonl(path: Path, label: str) -> Iterator[RawRecord]:
    with _open_text(path) as handle:
        yield from jsonl_lines(handle, label, first_line=1)


def jsonl_lines(lines: Iterable[str], label: str, first_line: int) -> Iterator[RawRecord]:
    """A record for every line that is not blank, numbered from ``first_line``."""
    for number, line in enumerate(lines, start=first_line):
        if line.strip():
            yield RawRecord(f"{label}:{number}", text=line, line=number)


_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")


def without_compression(name: str) -> str:
    """The file name, lower case, without a compression suffix (``data.jsonl.gz`` is ``data.jsonl``)."""
    name = name.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def is_jsonl(source: str) -> bool:
    """Whether ``source`` is a JSONL file (plain or compressed), whose records :class:`JsonlSpans` can cut into
    spans."""
    return without_compression(source).endswith(_JSONL_SUFFIXES) and Path(source).is_file()


def _json_array(path: Path, label: str) -> Iterator[RawRecord]:
    with _open_text(path) as handle:
        try:
            data = json.load(handle)
        except ValueError as exc:
            raise InputError(f"{path} is not valid JSON: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise InputError(f"{path} holds a JSON {type(data).__name__}, not a list of records")
    for index, item in enumerate(data):
        yield RawRecord(f"{label}:{index}", item)


#: Rows decoded at a time from a Parquet input.
PARQUET_BATCH = 1024


def _parquet(path: Path, label: str) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH):
        yield from rows_as_records(batch.to_pylist(), label, row)
        row += batch.num_rows


def rows_as_records(items: Iterable[Any], label: str, first_row: int) -> Iterator[RawRecord]:
    """Rows of a columnar input (Parquet, a ``datasets`` dataset) as records, the first numbered ``first_row``."""
    for row, item in enumerate(items, start=first_row):
        yield RawRecord(f"{label}:{row}", item)


def is_datasets_folder(path: Path) -> bool:
    """A folder ``datasets``' ``save_to_disk`` wrote (a dataset or a ``DatasetDict``)."""
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


def datasets_parts(path: Path) -> list[tuple[str, Any]]:
    """A ``datasets`` folder's datasets with the label of their records' ids: ``<folder>:<split>`` for each split of
    a ``DatasetDict``, ``<folder>`` for a single dataset."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        return [(f"{path.name}:{split}", dataset) for split, dataset in loaded.items()]
    return [(path.name, loaded)]


def _datasets_folder(path: Path) -> Iterator[RawRecord]:
    for label, dataset in datasets_parts(path):
        yield from rows_as_records(dataset, label, 0)


def load_hub(name: str) -> Any:
    """A hub dataset, ``REPO[:split]`` (``train`` when no split is named)."""
    import datasets

    repo, _, split = name.partition(":")
    try:
        return datasets.load_dataset(repo, split=split or "train")
    except Exception as exc:  # noqa: BLE001 - no network, unknown repo...: one clear message
        raise InputError(f"cannot load the dataset {repo!r} from the hub: {exc}") from None


def _hub(name: str) -> Iterator[RawRecord]:
    yield from rows_as_records(load_hub(name), name, 0)


def _hub_unreachable() -> str | None:
    """Why the Hugging Face hub cannot be reached, or None (offline mode, or it answered).

    One HEAD request through ``urllib`` (which honours the proxy variables); any HTTP answer, even an error status,
    means the hub is there. With ``HF_HUB_OFFLINE=1`` (or ``HF_DATASETS_OFFLINE=1``) no request is made: ``datasets``
    then reads its cache.
    """
    import os
    import urllib.error
    import urllib.request

    offline = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    if any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in offline):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=_HUB_PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return f"{endpoint} cannot be reached ({reason})"
    return None


def check_inputs(sources: list[str]) -> None:
    """Fail before any work on an input that does not exist, and on ``hub:`` inputs when the hub is unreachable."""
    hub_checked = False
    for source in sources:
        if not source.startswith("hub:"):
            if not Path(source).exists():
                raise InputError(f"{source} does not exist")
            continue
        if not hub_checked:
            hub_checked = True
            why = _hub_unreachable()
            if why is not None:
                raise InputError(
                    f"cannot load {source}: the Hugging Face hub is offline here ({why}); with the dataset in the "
                    "local cache, set HF_HUB_OFFLINE=1 to read it from there"
                )


def read_records(source: str | Path) -> Iterator[RawRecord]:
    """The records of one input: a file, a ``datasets`` folder (``save_to_disk``), or ``hub:<name>[:split]``."""
    text = str(source)
    if text.startswith("hub:"):
        yield from _hub(text[4:])
        return
    path = Path(source)
    label = path.name
    if path.is_dir():
        if is_datasets_folder(path):
            yield from _datasets_folder(path)
            return
        raise InputError(f"{path} is a folder but not a datasets folder saved with save_to_disk")
    if not path.is_file():
        raise InputError(f"{path} does not exist")
    name = without_compression(path.name)
    if name.endswith(_JSONL_SUFFIXES):
        yield from _jsonl(path, label)
    elif name.endswith(".json"):
        yield from _json_array(path, label)
    elif name.endswith(".parquet"):
        yield from _parquet(path, label)
    else:
        raise InputError(f"{path}: unknown input kind (use .jsonl[.gz|.zst], .json, .parquet or a datasets folder)")
