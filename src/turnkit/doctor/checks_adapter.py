"""The LoRA check: an adapter that adds tokens must train their embedding rows and the output head.

LoRA trains low-rank deltas of the modules it targets; the rows that ``resize_token_embeddings`` added for new
tokens start untrained and stay so unless the input embeddings and the output head are fully trainable
(``modules_to_save``) or their new rows are (``trainable_token_indices``). Such a chat fine-tune never learns to
write its end-of-turn marker, so it never stops.

A base made by ``turnkit add-chatml`` already holds the markers, so the adapter adds no tokens; its rows are still
untrained (mean-initialised). add-chatml lists their ids in the base's ``turnkit-lora.json``; they count as new here.

The module names differ by architecture (``embed_tokens``/``lm_head``, ``wte``, ``embed_in``/``embed_out``...). They
are read from the real model class built on the ``meta`` device from ``config.json``: no weights are read or
allocated.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from turnkit.doctor.context import Context
from turnkit.doctor.findings import Problem
from turnkit.errors import NotEvaluated

__all__ = ["check_adapter_base", "check_adapter_modules", "embedding_module_names", "saves_embeddings"]


def embedding_module_names(base: Path) -> tuple[str, str | None] | None:
    """``(input embeddings, output head)`` module names of the base's architecture, or None if unknown here."""
    try:
        text = (base / "config.json").read_text(encoding="utf-8")
    except OSError:
        return None
    return _module_names(text)


@functools.lru_cache(maxsize=8)
def _module_names(config_text: str) -> tuple[str, str | None] | None:
    """Build the model on the ``meta`` device (no memory, no weights) and name its embedding modules; cached by
    ``config.json``'s text, since building costs seconds."""
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return None
    try:
        values = json.loads(config_text)
        config = AutoConfig.for_model(values.pop("model_type"), **values)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - any architecture transformers cannot build here leaves the names unknown
        return None
    names = {id(module): name for name, module in model.named_modules()}
    head = model.get_output_embeddings()
    return names[id(model.get_input_embeddings())], None if head is None else names.get(id(head))


def _covers(entries: list[str], module: str) -> bool:
    """Whether a ``modules_to_save`` entry names ``module`` (PEFT matches an entry as a suffix of the name)."""
    return any(module == entry or module.endswith(f".{entry}") or module.endswith(entry) for entry in entries)


def _new_tokens(ctx: Context, base_tokenizer: Any, base_rows: int | None) -> dict[int, str]:
    """Tokens of the adapter's tokenizer (and markers of its template) that the base vocabulary lacks."""
    new: dict[int, str] = {}
    for content, token in ctx.tokenizer.added.items():
        if base_tokenizer.token_to_id(content) is None or (base_rows is not None and token.id >= base_rows):
            new[token.id] = content
    try:
        markers = ctx.skeleton.markers
    except NotEvaluated:
        markers = []
    for marker in markers:
        token_id = ctx.single_id(marker)
        if token_id is not None and base_tokenizer.token_to_id(marker) is None:
            new[token_id] = marker
    return new


#: Written by ``turnkit add-chatml`` beside the base's weights: ``new_token_ids`` are rows that start untrained.
ADD_CHATML_FILE = "turnkit-lora.json"


def _untrained_in_base(base: Path, base_tokenizer: Any) -> dict[int, str]:
    """Tokens add-chatml gave the base (``turnkit-lora.json``): in its vocabulary, but with untrained rows."""
    try:
        ids = json.loads((base / ADD_CHATML_FILE).read_text(encoding="utf-8")).get("new_token_ids") or []
    except (OSError, ValueError, AttributeError):
        return {}
    return {i: base_tokenizer.id_to_token(i) or f"id {i}" for i in ids if isinstance(i, int)}


def _tied(base: Path) -> bool:
    """Whether the base's ``config.json`` says its head and embeddings are one matrix."""
    try:
        return json.loads((base / "config.json").read_text(encoding="utf-8")).get("tie_word_embeddings") is True
    except (OSError, ValueError, AttributeError):
        return False


def _trainable_ids(indices: Any) -> set[int]:
    """The token ids ``trainable_token_indices`` makes trainable (a list, or a dict per module)."""
    if isinstance(indices, list):
        return {i for i in indices if isinstance(i, int)}
    if isinstance(indices, dict):
        return {i for ids in indices.values() if isinstance(ids, list) for i in ids if isinstance(i, int)}
    return set()


def saves_embeddings(ctx: Context) -> bool:
    """Whether the adapter saves the whole input embedding (``modules_to_save``), rows added for new tokens included."""
    adapter, config = ctx.target.adapter, ctx.target.config
    if adapter is None:
        return False
    names = _module_names(json.dumps(config.data)) if config is not None else None
    embed = names[0] if names is not None else "embed_tokens"
    return _covers([str(m) for m in adapter.config.data.get("modules_to_save") or []], embed)


def check_adapter_base(ctx: Context) -> list[Problem]:
    """``adapter-base-unavailable``: the adapter cannot be compared with its base, so its new tokens go unchecked."""
    adapter = ctx.target.adapter
    if adapter is None:
        raise NotEvaluated("not a PEFT adapter")
    if adapter.base is not None and adapter.base_tokenizer is not None:
        return []
    name = adapter.config.data.get("base_model_name_or_path")
    why = adapter.base_why or f"the base {adapter.base} has no tokenizer"
    download = f" (hf download {name} --local-dir DIR)" if isinstance(name, str) and name else ""
    return [
        Problem(
            f"cannot compare the adapter with its base: {why}; tokens the adapter's tokenizer adds to the base (whose "
            "rows LoRA must train: adapter-missing-modules-to-save) are not checked",
            f"give the base model's folder: turnkit doctor {ctx.target.given} --base PATH{download}",
            adapter.config.label,
        )
    ]


def check_adapter_modules(ctx: Context) -> list[Problem]:
    """``adapter-missing-modules-to-save``: new tokens, but embeddings and head are not trained."""
    adapter = ctx.target.adapter
    if adapter is None:
        raise NotEvaluated("not a PEFT adapter")
    if adapter.base is None or adapter.base_tokenizer is None:
        raise NotEvaluated("no base to compare with (see adapter-base-unavailable)")
    base_config = ctx.target.config.data if ctx.target.config else {}
    rows = base_config.get("vocab_size") if isinstance(base_config.get("vocab_size"), int) else None
    new = _new_tokens(ctx, adapter.base_tokenizer, rows)
    fresh = _untrained_in_base(adapter.base, adapter.base_tokenizer)
    new.update(fresh)
    if not new:
        return []
    config = adapter.config.data
    if set(new) <= _trainable_ids(config.get("trainable_token_indices")):
        return []
    saved = [str(m) for m in config.get("modules_to_save") or []]
    names = embedding_module_names(adapter.base)
    shown = ", ".join(f"{token!r} (id {i})" for i, token in sorted(new.items())[:5])
    what = (
        f"its base {adapter.base} was given {len(new)} token(s) by turnkit add-chatml ({shown}; {ADD_CHATML_FILE}), "
        "whose rows start untrained,"
        if set(new) <= set(fresh)
        else f"the adapter's tokenizer has {len(new)} token(s) its base {adapter.base} lacks ({shown})"
    )
    if names is None:
        missing = "the input embeddings and the output head (embed_tokens and lm_head for Llama-like models)"
        short = ["embed_tokens", "lm_head"]
    else:
        embed, head = names[0], names[1] or names[0]
        if _tied(adapter.base) and config.get("ensure_weight_tying") is True:
            head = embed  # PEFT trains the one matrix through the embeddings' copy (it drops the head's name)
        if _covers(saved, embed) and _covers(saved, head):
            return []
        missing = " and ".join(dict.fromkeys(n for n in (embed, head) if not _covers(saved, n)))
        short = list(dict.fromkeys(n.rsplit(".", 1)[-1] for n in (embed, head)))
    return [
        Problem(
            f"{what} but adapter_config.json modules_to_save {saved or None} does not cover {missing}: LoRA leaves "
            "the new rows untrained, so the model never learns to read or write these tokens (a chat fine-tune that "
            "never stops)",
            f"train again with LoraConfig(..., modules_to_save={short}) (or trainable_token_indices with the new "
            "ids), and save the tokenizer next to the adapter",
            adapter.config.label,
        )
    ]
