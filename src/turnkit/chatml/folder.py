"""``turnkit add-chatml BASE --out DIR``: a base model folder in, a ChatML model folder out, audited by doctor.

BASE is only read. Everything is checked before the weights are loaded (a GGUF file, missing weights or tokenizer,
another chat template, a DIR that is not empty) so a refusal costs no time. The model, tokenizer, template and both
configs are written together into DIR, with ``turnkit-lora.json`` (the module names LoRA must train in full), and
the result goes through ``turnkit doctor``: a conversion that doctor finds an error in is an error here too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turnkit import doctor
from turnkit.chatml.convert import ChatMLChanges, add_chatml, check_template
from turnkit.chatml.template import chatml_template
from turnkit.chatml.weights import Init
from turnkit.errors import ChatMLError
from turnkit.quiet import progress_bars

__all__ = ["LORA_FILE", "FolderResult", "add_chatml_to_folder", "check_base", "check_out"]

#: Written beside the weights: what LoRA's ``modules_to_save`` must name for this architecture.
LORA_FILE = "turnkit-lora.json"

_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
_TOKENIZER = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@dataclass(frozen=True)
class FolderResult:
    """A converted folder: where it is, what changed, and doctor's report on it (no errors, by construction)."""

    out: Path
    changes: ChatMLChanges
    report: Any


def check_base(base: str | Path) -> Path:
    """The base folder, or :class:`ChatMLError` saying why it cannot be converted."""
    path = Path(base)
    if path.is_file():
        with path.open("rb") as handle:
            magic = handle.read(4)
        if magic == b"GGUF" or path.suffix.lower() == ".gguf":
            raise ChatMLError(
                f"{path} is a GGUF file: add-chatml needs the Hugging Face folder (config.json, weights, tokenizer) "
                "it was converted from; convert that folder, fine-tune it, then convert the result to GGUF"
            )
        raise ChatMLError(f"{path} is a file: give a Hugging Face model folder")
    if not path.is_dir():
        raise ChatMLError(f"the base model {path} does not exist")
    if not (path / "config.json").is_file():
        raise ChatMLError(f"{path} has no config.json: not a Hugging Face model folder")
    if not any((path / name).is_file() for name in _WEIGHTS) and not any(path.glob("*.safetensors")):
        raise ChatMLError(f"{path} has no weights (model.safetensors or pytorch_model.bin): add-chatml resizes them")
    if not any((path / name).is_file() for name in _TOKENIZER):
        raise ChatMLError(f"{path} has no tokenizer (tokenizer.json or tokenizer_config.json): add-chatml adds tokens")
    return path


def check_out(out: str | Path, base: Path) -> Path:
    """DIR must not exist or be empty; it is never BASE (BASE is only read)."""
    path = Path(out)
    if path.exists() and path.resolve() == base.resolve():
        raise ChatMLError(f"--out {path} is the base folder: add-chatml never modifies the base; give a new folder")
    if path.exists() and not path.is_dir():
        raise ChatMLError(f"--out {path} is a file: give a new or empty folder")
    if path.is_dir() and any(path.iterdir()):
        raise ChatMLError(f"--out {path} is not empty: give a new or empty folder (nothing there is overwritten)")
    return path


def _untrained_before(base: Path) -> list[int]:
    """Rows a base made by add-chatml (and not fine-tuned since) says are still untrained: they stay listed."""
    try:
        ids = json.loads((base / LORA_FILE).read_text(encoding="utf-8")).get("new_token_ids") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [i for i in ids if isinstance(i, int)]


def add_chatml_to_folder(
    base: str | Path,
    out: str | Path,
    *,
    system_prompt: str | None = None,
    pad_to_multiple_of: int | None = None,
    init: Init = "mean",
    force: bool = False,
) -> FolderResult:
    """Convert the model folder ``base`` into a ChatML model folder ``out`` and audit it with doctor.

    Raises:
        ChatMLError: BASE cannot be converted, DIR is not empty, or doctor finds an error in the result.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_path = check_base(base)
    out_path = check_out(out, base_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(base_path)
    except (OSError, ValueError) as exc:
        raise ChatMLError(f"cannot load the tokenizer of {base_path}: {exc}") from None
    check_template(tokenizer.chat_template, chatml_template(system_prompt), force=force, where=str(base_path))
    with progress_bars(shown=False):  # loading and saving a folder: add-chatml prints its own summary
        try:
            model = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
        except (OSError, ValueError) as exc:
            raise ChatMLError(f"cannot load the model in {base_path}: {exc}") from None
        changes = add_chatml(
            model, tokenizer, system_prompt=system_prompt, pad_to_multiple_of=pad_to_multiple_of, init=init, force=True
        )
        out_path.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_path)
        tokenizer.save_pretrained(out_path)
    lora = changes.lora
    lora["new_token_ids"] = sorted({*lora["new_token_ids"], *_untrained_before(base_path)})
    (out_path / LORA_FILE).write_text(json.dumps(lora, indent=2) + "\n", encoding="utf-8")
    report = doctor.run(out_path)
    if report.errors:
        found = "; ".join(f"{f.check}: {f.message}" for f in report.errors)
        raise ChatMLError(f"turnkit doctor finds errors in {out_path} (a bug in add-chatml, please report): {found}")
    return FolderResult(out_path, changes, report)
