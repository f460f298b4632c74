"""Reading training data: JSONL (plain, gzip, zstd), JSON arrays, Parquet, ``datasets`` folders and hub names.

Every record gets a stable id (``<input>:<line or row>``) so that a rejected record can be found again, and so that a
rerun after a crash lines up with the first run. A line that is not valid JSON is not an exception: it is a
:class:`RawRecord` carrying its error, and ends up in ``rejects.jsonl`` with the line number.
"""

from __future__ import annotations

import codecs
import gzip
import io
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from turnkit.errors import InputError

__all__ = [
    "ArrowSlices",
    "InputError",
    "JsonlSpan",
    "JsonlSpans",
    "RawRecord",
    "RecordsByReference",
    "RowSlice",
    "ShardCutter",
    "check_inputs",
    "is_jsonl",
    "read_records",
    "records_of",
    "shard_cutter",
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
_ENCODING = "utf-8-sig"
_ERRORS = "surrogateescape"


def _open_binary(path: Path) -> BinaryIO:
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
    return io.TextIOWrapper(_open_binary(path), encoding=_ENCODING, errors=_ERRORS)


def _jsonl(path: Path, label: str) -> Iterator[RawRecord]:
    with _open_text(path) as handle:
        yield from _jsonl_lines(handle, label, first_line=1)


def _jsonl_lines(lines: Iterable[str], label: str, first_line: int) -> Iterator[RawRecord]:
    """A record for every line that is not blank, numbered from ``first_line``."""
    for number, line in enumerate(lines, start=first_line):
        if line.strip():
            yield RawRecord(f"{label}:{number}", text=line, line=number)


_JSONL_SUFFIXES = (".jsonl", ".ndjson")
_COMPRESSED_SUFFIXES = (".gz", ".zst", ".zstd")


def _without_compression(name: str) -> str:
    name = name.lower()
    for suffix in _COMPRESSED_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def is_jsonl(source: str) -> bool:
    """Whether ``source`` is a JSONL file (plain or compressed), whose records :class:`JsonlSpans` can cut into
    spans."""
    return _without_compression(source).endswith(_JSONL_SUFFIXES) and Path(source).is_file()


@dataclass(frozen=True)
class JsonlSpan:
    """Records of a JSONL file by where they lie: bytes ``start`` to ``end`` of its text (decompressed), ``count``
    records, the first line numbered ``first_line``; for a compressed file, or workers that may not see the file (Ray
    actors), those bytes (``data``).

    A shard goes to a worker process as its spans and the worker makes the records itself. A plain file's span is a
    few numbers and the worker reads the lines from the file: the process that reads the input then neither pickles
    the text nor pushes it through a pipe (which took it 20-40 ms a shard, holding up the first shards while the
    workers waited). A compressed file's span carries its lines' bytes, one buffer instead of a record object a line.
    :meth:`records` gives exactly the records :func:`read_records` gives for those lines: same ids, line numbers and
    text.
    """

    path: str
    label: str
    start: int
    end: int
    first_line: int
    count: int
    data: bytes | None = None

    def records(self) -> Iterator[RawRecord]:
        data = self.data
        if data is None:
            with open(self.path, "rb") as handle:
                handle.seek(self.start)
                data = handle.read(self.end - self.start)
        # decoded as _open_text reads the file: UTF-8 (a BOM only at its start), universal newlines (a lone \r too)
        text = io.TextIOWrapper(io.BytesIO(data), encoding=_ENCODING if self.start == 0 else "utf-8", errors=_ERRORS)
        yield from _jsonl_lines(text, self.label, self.first_line)


def _blank(line: bytes) -> bool:
    """Whether a line (without its line break) holds only whitespace, as ``str.strip`` sees it after decoding."""
    rest = line.strip()  # ASCII whitespace; str.strip also strips \x1c-\x1f and non-ASCII spaces
    if not rest:
        return True
    if rest[0] < 0x80 and not 0x1C <= rest[0] <= 0x1F:
        return False
    return not line.decode("utf-8", "replace").strip()


#: Bytes of a JSONL file read at a time to cut it into spans (a block is extended to the end of its last line).
_SPAN_BLOCK = 1 << 20


def _lines_of(block: bytes, *, starts_file: bool) -> tuple[Any, Any]:
    r"""Where each line of ``block`` ends (the offset after its line break) and how many records the lines up to and
    including it hold, as two numpy arrays. ``starts_file``: the block is the file's start, where a BOM is no text.

    A block without ``\r`` (nearly every file) is cut where its ``\n`` are and a line is looked at only where its first
    byte is not printable ASCII (a record starts with ``{``); others go line by line (:func:`_lines_one_by_one`).
    """
    import numpy as np

    if b"\r" in block or (starts_file and block.startswith(codecs.BOM_UTF8)):
        ends_list, records = _lines_one_by_one(block, starts_file=starts_file)
        return np.array(ends_list, np.int64), np.cumsum(np.array(records, np.int64))
    view = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(view == 0x0A) + 1
    if not len(ends) or ends[-1] != len(block):
        ends = np.append(ends, len(block))  # the file's last line, without a line break
    starts = np.concatenate(([0], ends[:-1]))
    lengths = ends - starts
    lengths[view[ends - 1] == 0x0A] -= 1
    record = np.ones(len(ends), np.int64)
    first = view[starts]  # a line of length 0 still has its \n there
    for line in np.flatnonzero((lengths == 0) | (first <= 0x20) | (first >= 0x7F)):
        record[line] = not _blank(block[starts[line] : starts[line] + lengths[line]])
    return ends, np.cumsum(record)


def _lines_one_by_one(block: bytes, *, starts_file: bool) -> tuple[list[int], list[bool]]:
    r""":func:`_lines_of` line by line, for a block holding ``\r`` (``\r\n`` and a lone ``\r`` each end a line too)
    or the file's first block when it starts with a BOM."""
    ends: list[int] = []
    records: list[bool] = []
    position = 0
    while position < len(block):
        newline = block.find(b"\n", position)
        end = len(block) if newline < 0 else newline + 1
        raw = block[position:end]
        if raw.endswith(b"\r\n"):
            body, ended = raw[:-2], True
        elif raw.endswith(b"\n"):
            body, ended = raw[:-1], True
        else:
            body, ended = raw, False
        skip = len(codecs.BOM_UTF8) if starts_file and position == 0 and body.startswith(codecs.BOM_UTF8) else 0
        body = body[skip:]
        pieces = body.split(b"\r")
        if not ended and len(pieces) > 1 and body.endswith(b"\r"):
            pieces.pop()  # "a\r" at the end of the file is one line
        used = position + skip
        for number, piece in enumerate(pieces):
            used = end if number == len(pieces) - 1 else used + len(piece) + 1
            ends.append(used)
            records.append(not _blank(piece))
        position = end
    return ends, records


class JsonlSpans:
    r"""Cuts a JSONL file (plain or compressed) into spans (:class:`JsonlSpan`) of a given number of records, reading
    only its bytes.

    Lines and blank lines are counted as the text reader counts them (universal newlines: ``\n``, ``\r\n`` and a lone
    ``\r`` each end a line; a line of whitespace is no record), so that spans cut a file where the records
    :func:`read_records` yields would be cut. The file is read once, forward (a compressed stream cannot go back), in
    blocks whose lines are found at once (:func:`_lines_of`); a span may end inside a block, and the next one goes on
    from there. ``carry_data``: spans carry their bytes even from a plain file (for workers that may not see the file:
    Ray's).
    """

    def __init__(self, path: str, *, carry_data: bool = False) -> None:
        import numpy as np

        self.path = path
        self.label = Path(path).name
        self.carry_data = carry_data or _without_compression(path) != path.lower()  # a compressed file's always
        self.handle = _open_binary(Path(path))  # read across calls to take(); closed by close()
        self.offset = 0
        self.line = 1
        self.block = b""  # the block being cut: its lines' ends, the records up to each, the next line to take
        self.ends: Any = np.zeros(0, np.int64)
        self.records_through: Any = self.ends
        self.next = 0

    def _read_block(self) -> bool:
        """Reads the next block; False at the end of the file."""
        block = self.handle.read(_SPAN_BLOCK)
        if not block:
            return False
        if not block.endswith(b"\n"):
            block += self.handle.readline()  # to the end of its last line: a \r\n is never cut in two
        self.ends, self.records_through = _lines_of(block, starts_file=self.offset == 0)
        self.block, self.next = block, 0
        return True

    def take(self, wanted: int) -> JsonlSpan | None:
        """The span of the next ``wanted`` records (fewer at the end of the file); None when none is left."""
        import numpy as np

        start, first_line, count = self.offset, self.line, 0
        kept: list[bytes] = []  # the span's bytes, where it carries them
        while count < wanted:
            if self.next == len(self.ends) and not self._read_block():
                break
            before = int(self.records_through[self.next - 1]) if self.next else 0
            # the line that completes the span, or the block's last one
            last = min(int(np.searchsorted(self.records_through, before + wanted - count)), len(self.ends) - 1)
            begin, end = int(self.ends[self.next - 1]) if self.next else 0, int(self.ends[last])
            count += int(self.records_through[last]) - before
            self.line += last + 1 - self.next
            self.offset += end - begin
            if self.carry_data:
                kept.append(self.block[begin:end])
            self.next = last + 1
        if count == 0:
            return None
        data = b"".join(kept) if self.carry_data else None
        return JsonlSpan(self.path, self.label, start, self.offset, first_line, count, data)

    def close(self) -> None:
        self.handle.close()


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
_PARQUET_BATCH = 1024


def _parquet(path: Path, label: str) -> Iterator[RawRecord]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_PARQUET_BATCH):
        yield from _rows(batch.to_pylist(), label, row)
        row += batch.num_rows


def _rows(items: Iterable[Any], label: str, first_row: int) -> Iterator[RawRecord]:
    """Rows of a columnar input (Parquet, a ``datasets`` dataset) as records, the first numbered ``first_row``."""
    for row, item in enumerate(items, start=first_row):
        yield RawRecord(f"{label}:{row}", item)


@dataclass(frozen=True)
class RowSlice:
    """Rows of a columnar input (Parquet, a ``datasets`` dataset) as Arrow data (its IPC stream format): ``count``
    rows, the first numbered ``first_row``, their ids ``<label>:<row>``.

    The process that reads the input decodes the rows (Arrow's C++ reader, no Python objects) and sends them as one
    buffer; the worker makes the records. Before, the reading process made every row a Python dict and pickled it,
    twice its CPU now: work that held up two workers on two cores (1.28-1.48x one worker on Parquet input, now
    1.44-1.63x as on JSONL). :meth:`records` gives exactly the records :func:`read_records` gives for those rows.
    """

    label: str
    first_row: int
    count: int
    data: bytes

    def records(self) -> Iterator[RawRecord]:
        import pyarrow as pa

        table = pa.ipc.open_stream(self.data).read_all()
        return _rows(table.to_pylist(), self.label, self.first_row)


class ArrowSlices:
    """Cuts columnar data into :class:`RowSlice` s of a given number of rows: ``parts`` are (label, record batches),
    each part's rows numbered from 0 (a Parquet file; the splits of a ``datasets`` folder). Any batch layout: a slice
    may span batches (Parquet row groups), a batch may hold many slices; a slice never spans parts."""

    def __init__(self, parts: Iterable[tuple[str, Iterable[Any]]], close: Callable[[], None] | None = None) -> None:
        self.parts = iter(parts)
        self.label = ""
        self.batches: Iterator[Any] = iter(())
        self.left: Any = None  # the rest of a batch the last slice ended in
        self.row = 0
        self._close = close

    @classmethod
    def of_parquet(cls, path: str) -> ArrowSlices:
        import pyarrow.parquet as pq

        file = pq.ParquetFile(path)
        return cls([(Path(path).name, file.iter_batches(batch_size=_PARQUET_BATCH))], close=file.close)

    @classmethod
    def of_datasets(cls, parts: Iterable[tuple[str, Any]]) -> ArrowSlices | None:
        """Slices of ``datasets`` datasets, given as (label, dataset); None where a feature needs decoding (images,
        audio, JSON kept as text...): its rows as Arrow hold what ``datasets`` would decode, so they are read and sent
        as records."""
        from datasets.features.features import require_decoding

        parts = list(parts)
        if any(require_decoding(feature) for _, dataset in parts for feature in dataset.features.values()):
            return None
        return cls((label, _arrow_batches(dataset)) for label, dataset in parts)

    def take(self, wanted: int) -> RowSlice | None:
        """The next ``wanted`` rows (fewer at the end of a part); None when none is left."""
        import pyarrow as pa

        batches: list[Any] = []
        count = 0
        while count < wanted:
            batch = self.left if self.left is not None else next(self.batches, None)
            self.left = None
            if batch is None:
                if count:
                    break  # a slice ends with its part: the next part's rows have other ids
                part = next(self.parts, None)
                if part is None:
                    break
                self.label, self.batches, self.row = part[0], iter(part[1]), 0
                continue
            if batch.num_rows > wanted - count:
                batch, self.left = batch.slice(0, wanted - count), batch.slice(wanted - count)
            if batch.num_rows:
                batches.append(batch)
                count += batch.num_rows
        if count == 0:
            return None
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema) as stream:  # a slice's own bytes (pickle sends all)
            for batch in batches:
                stream.write_batch(batch)
        first, self.row = self.row, self.row + count
        return RowSlice(self.label, first, count, sink.getvalue().to_pybytes())

    def close(self) -> None:
        if self._close is not None:
            self._close()


def _arrow_batches(dataset: Any) -> Iterator[Any]:
    """A ``datasets`` dataset's rows as Arrow record batches, in its order (an index mapping applied)."""
    for table in dataset.with_format("arrow").iter(batch_size=_PARQUET_BATCH):
        yield from table.to_batches()


class RecordsByReference(Protocol):
    """Records a worker makes itself from what it is sent (:class:`JsonlSpan`, :class:`RowSlice`)."""

    @property
    def count(self) -> int: ...

    def records(self) -> Iterator[RawRecord]: ...


class ShardCutter(Protocol):
    """Cuts one input into pieces of a given number of records, sent to workers by reference."""

    def take(self, wanted: int) -> RecordsByReference | None: ...

    def close(self) -> None: ...


def shard_cutter(source: str, *, carry_data: bool = False) -> ShardCutter | None:
    """How to send ``source``'s records to workers by reference (JSONL: spans of the file, with their bytes where it
    is compressed or ``carry_data``; Parquet, ``datasets`` folders and hub datasets: rows as Arrow data), or None
    where it is read and its records sent (JSON arrays; datasets with features to decode, such as images)."""
    if is_jsonl(source):
        return JsonlSpans(source, carry_data=carry_data)
    if source.startswith("hub:"):
        name = source[4:]
        return ArrowSlices.of_datasets([(name, _load_hub(name))])
    path = Path(source)
    if path.is_dir() and _is_datasets_folder(path):
        return ArrowSlices.of_datasets(_datasets_parts(path))
    if source.lower().endswith(".parquet") and path.is_file():
        return ArrowSlices.of_parquet(source)
    return None


def records_of(items: Iterable[RawRecord | RecordsByReference]) -> list[RawRecord]:
    """The records of a shard given as records, references to them (spans, row slices) or both."""
    records: list[RawRecord] = []
    for item in items:
        if isinstance(item, RawRecord):
            records.append(item)
        else:
            records.extend(item.records())
    return records


def _is_datasets_folder(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


def _datasets_parts(path: Path) -> list[tuple[str, Any]]:
    """A ``datasets`` folder's datasets with the label of their records' ids: ``<folder>:<split>`` for each split of
    a ``DatasetDict``, ``<folder>`` for a single dataset."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        return [(f"{path.name}:{split}", dataset) for split, dataset in loaded.items()]
    return [(path.name, loaded)]


def _datasets_folder(path: Path) -> Iterator[RawRecord]:
    for label, dataset in _datasets_parts(path):
        yield from _rows(dataset, label, 0)


def _load_hub(name: str) -> Any:
    import datasets

    repo, _, split = name.partition(":")
    try:
        return datasets.load_dataset(repo, split=split or "train")
    except Exception as exc:  # noqa: BLE001 - no network, unknown repo...: one clear message
        raise InputError(f"cannot load the dataset {repo!r} from the hub: {exc}") from None


def _hub(name: str) -> Iterator[RawRecord]:
    yield from _rows(_load_hub(name), name, 0)


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
        if _is_datasets_folder(path):
            yield from _datasets_folder(path)
            return
        raise InputError(f"{path} is a folder but not a datasets folder saved with save_to_disk")
    if not path.is_file():
        raise InputError(f"{path} does not exist")
    name = _without_compression(path.name)
    if name.endswith(_JSONL_SUFFIXES):
        yield from _jsonl(path, label)
    elif name.endswith(".json"):
        yield from _json_array(path, label)
    elif name.endswith(".parquet"):
        yield from _parquet(path, label)
    else:
        raise InputError(f"{path}: unknown input kind (use .jsonl[.gz|.zst], .json, .parquet or a datasets folder)")
