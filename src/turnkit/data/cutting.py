"""Cutting inputs into shards that worker processes make the records of themselves: spans of a JSONL file, rows of a
Parquet file or a ``datasets`` dataset as Arrow data.

``turnkit prepare`` sends a shard to a worker by reference rather than as records: the process that reads the input
then neither parses nor pickles the text. A piece's :meth:`records` are exactly the records
:func:`~.sources.read_records` gives for the same lines or rows (same ids, line numbers and text), so a shard is the
same whichever way it travels (tests/data/test_prepare.py checks it on tricky and random files).
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from turnkit.data.sources import (
    PARQUET_BATCH,
    TEXT_ENCODING,
    TEXT_ERRORS,
    RawRecord,
    datasets_parts,
    is_datasets_folder,
    is_jsonl,
    jsonl_lines,
    load_hub,
    open_binary,
    rows_as_records,
    without_compression,
)

__all__ = [
    "ArrowSlices",
    "JsonlSpan",
    "JsonlSpans",
    "RecordsByReference",
    "RowSlice",
    "ShardCutter",
    "records_of",
    "shard_cutter",
]


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
        # decoded as the reader opens the file: UTF-8 (a BOM only at its start), universal newlines (a lone \r too)
        text = io.TextIOWrapper(
            io.BytesIO(data), encoding=TEXT_ENCODING if self.start == 0 else "utf-8", errors=TEXT_ERRORS
        )
        yield from jsonl_lines(text, self.label, self.first_line)


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
        self.carry_data = carry_data or without_compression(path) != path.lower()  # a compressed file's always
        self.handle = open_binary(Path(path))  # read across calls to take(); closed by close()
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
        return rows_as_records(table.to_pylist(), self.label, self.first_row)


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
        return cls([(Path(path).name, file.iter_batches(batch_size=PARQUET_BATCH))], close=file.close)

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
    for table in dataset.with_format("arrow").iter(batch_size=PARQUET_BATCH):
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
        return ArrowSlices.of_datasets([(name, load_hub(name))])
    path = Path(source)
    if path.is_dir() and is_datasets_folder(path):
        return ArrowSlices.of_datasets(datasets_parts(path))
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
