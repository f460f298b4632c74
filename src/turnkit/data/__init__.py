"""Training data: datasets to tokenized, masked Parquet shards (``turnkit prepare``).

* :mod:`.sources`: reading JSONL (gzip, zstd), JSON arrays, Parquet, datasets folders, hub names;
* :mod:`.formats`: OpenAI messages, ShareGPT and Alpaca records to conversations;
* :mod:`.pipeline`: the batch function: marker scan, encoding, max-length, rows and rejects;
* :mod:`.prepare`: shards, resume, manifest and rejects; the local and Ray engines.
"""

from turnkit.data.formats import FORMATS, FieldMap, RecordError
from turnkit.data.pipeline import PrepareConfig, process_records
from turnkit.data.prepare import PrepareError, load_rows, prepare, report

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
