"""The inspect page of prepared shards: N rows sampled from ``turnkit prepare``'s Parquet files, as training sees them.

A row holds only ``input_ids`` and ``labels`` (and its record id): that is exactly what a trainer reads, so that is
what the page shows, decoded with the model's tokenizer. Control ids are known from the tokenizer; which plain text
came from the template and which from data is not recorded in a row, so those tokens have origin ``text``.

The manifest records the sha256 of the tokenizer the shards were made with; inspecting them with another tokenizer
would show the wrong text for every id, so that is refused.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from turnkit.errors import InputError
from turnkit.format import ChatFormat
from turnkit.inspect.page import Page, example_from_arrays
from turnkit.inspect.tokens import TokenTexts

__all__ = ["prepared_model", "shards_page"]


def _parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise InputError(f"{path} does not exist")
    folder = path / "shards" if (path / "shards").is_dir() else path
    files = sorted(folder.rglob("*.parquet"))
    if not files:
        raise InputError(f"{path} holds no .parquet shards (give the folder `turnkit prepare --out` wrote)")
    return files


def _manifest(path: Path) -> tuple[Path, dict[str, Any] | None]:
    """Where the manifest of the shards under ``path`` is (the ``--out`` folder, or two levels above one of its
    ``.parquet`` files), and what it holds (None when it is not there)."""
    manifest_path = path / "manifest.json" if path.is_dir() else path.parent.parent / "manifest.json"
    if not manifest_path.is_file():
        return manifest_path, None
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {manifest_path}: {exc}") from None
    return manifest_path, manifest if isinstance(manifest, dict) else {}


def prepared_model(path: str | Path) -> str:
    """The model ``turnkit prepare`` made the shards under ``path`` with, as its manifest names it (a folder, a
    ``.gguf`` file, or ``default``).

    Raises:
        InputError: No manifest names one (shards from elsewhere, or moved away from their manifest).
    """
    manifest_path, manifest = _manifest(Path(path))
    options = (manifest or {}).get("options")
    model = options.get("model") if isinstance(options, dict) else None
    if not isinstance(model, str) or not model:
        where = "names none" if manifest is not None else "is not there"
        raise InputError(
            f"--data {path}: no manifest names the model to read the shards with ({manifest_path} {where}): give "
            "--model PATH (or default)"
        )
    return model


def _check_tokenizer(path: Path, fmt: ChatFormat) -> str:
    """The manifest's note for the page; raises when the shards were made with another tokenizer."""
    _, manifest = _manifest(path)
    if manifest is None:
        return "No manifest.json beside the shards: the tokenizer they were made with is not checked."
    expected = manifest.get("tokenizer_sha256")
    if expected:
        actual = hashlib.sha256(fmt.tokenizer.backend.to_str().encode()).hexdigest()
        if actual != expected:
            model = manifest.get("options", {}).get("model")
            raise InputError(
                f"the shards in {path} were prepared with another tokenizer (sha256 {expected[:12]}…, this model's "
                f"is {actual[:12]}…): give the --model they were prepared with ({model})"
            )
    return ""


def shards_page(fmt: ChatFormat, path: str | Path, *, sample: int = 5, seed: int = 0) -> Page:
    """The page model of ``sample`` rows drawn (reproducibly, by ``seed``) from the shards under ``path``."""
    import pyarrow.parquet as pq

    if sample < 1:
        raise InputError(f"--sample must be at least 1, got {sample}")
    path = Path(path)
    files = _parquet_files(path)
    note = _check_tokenizer(path, fmt)
    sizes = [pq.ParquetFile(file).metadata.num_rows for file in files]
    total = sum(sizes)
    if total == 0:
        raise InputError(f"the shards under {path} hold no rows")
    chosen = sorted(random.Random(seed).sample(range(total), min(sample, total)))
    texts = TokenTexts(fmt.tokenizer, fmt.stops)
    examples = []
    offset = 0
    for file, size in zip(files, sizes, strict=True):
        wanted = [n - offset for n in chosen if offset <= n < offset + size]
        offset += size
        if not wanted:
            continue
        table = pq.read_table(file)
        for column in ("input_ids", "labels"):
            if column not in table.column_names:
                raise InputError(f"{file} has no {column!r} column: not a shard written by turnkit prepare")
        for row in table.take(wanted).to_pylist():
            record = row.get("record_id") or f"{file.name} row"
            turn = row.get("turn")
            title = f"{record}" + (f" (turn {turn})" if turn is not None else "")
            examples.append(example_from_arrays(row["input_ids"], row["labels"], texts, title=title))
    notes = [
        f"{len(examples)} of {total:,} rows, drawn with seed {seed}, decoded from their input_ids and labels. Shards "
        "do not record which text came from the template and which from data: plain tokens show as 'text'."
    ]
    return Page(
        title=f"turnkit inspect: {path.name}",
        source=f"{path} · {fmt.templates.origin}",
        examples=examples,
        notes=[*notes, *([note] if note else [])],
    )
