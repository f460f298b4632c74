"""Training data: datasets to tokenized, masked Parquet shards (``turnkit prepare``).

* :mod:`.sources`: reading JSONL (gzip, zstd), JSON arrays, Parquet, datasets folders, hub names;
* :mod:`.cutting`: inputs cut into spans and row slices that worker processes make the records of;
* :mod:`.formats`: OpenAI messages, ShareGPT and Alpaca records to conversations;
* :mod:`.pipeline`: the batch function: marker scan, encoding, max-length, rows and rejects;
* :mod:`.prepare`: the shards planned, resumed and run: the local and Ray runners;
* :mod:`.output`: what a run writes (shards and their done-files, manifest, rejects) and reading it back.
"""

from turnkit.data.formats import FORMATS, FieldMap, RecordError
from turnkit.data.output import load_rows, report
from turnkit.data.pipeline import PrepareConfig, process_records
from turnkit.data.prepare import PrepareError, prepare

__all__ = [
    "FORMATS",
    "FieldMap",
    "PrepareConfig",
    "PrepareError",
    "RecordError",
    "load_rows",
    "prepare",
    "process_records",
    "report",
]
