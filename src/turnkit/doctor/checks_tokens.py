"""Checks of the template against the tokenizer and configs: markers as ids, stopping, BOS, vocabulary, pad, forgery.

The template is rendered and the render tokenized for real; ids are always looked up in this checkpoint's tokenizer.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from turnkit.doctor.checks_adapter import saves_embeddings
from turnkit.doctor.checks_template import template_file
from turnkit.doctor.context import Context
from turnkit.doctor.findings import Problem, Severity
from turnkit.doctor.forgery import run_forgery
from turnkit.doctor.probe import tool_markers
from turnkit.doctor.target import Target
from turnkit.errors import NotEvaluated

__all__ = [
    "check_double_bos",
    "check_end_marker_exists",
    "check_eos",
    "check_forgery",
    "check_generation_config_eos",
    "check_markers_single",
    "check_non_special",
    "check_pad",
    "check_vocab",
]


def _gguf_new_metadata(target: Target, change: str) -> str:
    """gguf-py's ``gguf-new-metadata`` command that writes a fixed copy of the target GGUF, named by its full path (the
    embedded model's lies in the cache, and a bare file name runs only from the file's own folder)."""
    return f"`gguf-new-metadata {shlex.quote(os.path.abspath(target.path))} fixed.gguf {change}`"


def _tokenizer_file(ctx: Context) -> str:
    target = ctx.target
    if target.kind == "gguf":
        return target.path.name
    config = target.tokenizer_config
    return "tokenizer.json" if config is None else config.label.replace("tokenizer_config.json", "tokenizer.json")


def check_markers_single(ctx: Context) -> list[Problem]:
    """``marker-not-single-token``: a marker the template writes around turns is several token ids."""
    problems = []
    for marker in ctx.skeleton.markers:
        if ctx.single_id(marker) is not None:
            continue
        ids = ctx.tokenizer.encode(marker).ids
        pieces = [ctx.token_text(i) for i in ids]
        problems.append(
            Problem(
                f"{template_file(ctx)} writes {marker!r} around turns, but {_tokenizer_file(ctx)} splits it into "
                f"{len(ids)} tokens {ids} {pieces}: the model sees a rare sequence instead of one learned marker, "
                "and user text can type it",
                f"add {marker!r} as a special token and resize the embeddings (tokenizer.add_special_tokens("
                f"{{'additional_special_tokens': [{marker!r}]}}); model.resize_token_embeddings(len(tokenizer))), "
                "or correct the template to the marker the tokenizer holds",
                template_file(ctx),
            )
        )
    return problems


def check_end_marker_exists(ctx: Context) -> list[Problem]:
    """``no-end-marker``: the template closes an assistant reply with no marker at all."""
    if ctx.skeleton.end_marker is not None:
        return []
    return [
        Problem(
            f"{template_file(ctx)} writes no marker after an assistant reply: the model has no token to stop on, so "
            "generation runs on until max_tokens or a stop string",
            "close every turn with a special token (ChatML's <|im_end|>; `turnkit add-chatml` adds it) and list it "
            "as EOS",
            template_file(ctx),
        )
    ]


def _stop_sources(ctx: Context) -> list[tuple[str, list[int]]]:
    """Where generation takes its stop ids from, and the ids each place lists."""
    target = ctx.target
    if target.gguf is not None:
        return [(f"{target.path.name} eos/eot/eom", list(target.gguf.eos_ids))]
    sources = []
    if target.generation_config is not None:
        sources.append((f"{target.generation_config.label} eos_token_id", _ids(target.generation_config.data)))
    elif target.config is not None:
        sources.append((f"{target.config.label} eos_token_id (no generation_config.json)", _ids(target.config.data)))
    eos = ctx.fmt.eos_token
    if eos is not None and (token_id := ctx.single_id(eos)) is not None:
        label = target.tokenizer_config.label if target.tokenizer_config else "the tokenizer"
        sources.append((f"{label} eos_token {eos!r}", [token_id]))
    return sources


def _ids(config: dict[str, Any]) -> list[int]:
    value = config.get("eos_token_id")
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _listing(sources: list[tuple[str, list[int]]]) -> str:
    return "; ".join(f"{where}: {ids}" for where, ids in sources) or "nothing declares an EOS id"


def check_eos(ctx: Context) -> list[Problem]:
    """``eos-not-end-marker``: the template's end-of-turn marker is not among the ids generation stops on."""
    marker, token_id = ctx.end_marker()
    sources = _stop_sources(ctx)
    if any(token_id in ids for _, ids in sources):
        return []
    target = ctx.target
    if target.gguf is not None:
        fix = _gguf_new_metadata(target, f"--special-token eot {shlex.quote(marker)}")
        where = target.path.name
    else:
        listed = sorted({i for _, ids in sources for i in ids})
        fix = f'set "eos_token_id": {[token_id, *listed]} in generation_config.json (keep the ids already there)'
        where = "generation_config.json"
    return [
        Problem(
            f"the template ends assistant turns with {marker!r} (id {token_id}) but generation stops only on other "
            f"ids ({_listing(sources)}): replies run on past the end of the turn into invented turns",
            fix,
            where,
        )
    ]


def check_generation_config_eos(ctx: Context) -> list[Problem]:
    """``generation-config-eos``: only the tokenizer lists the end marker; transformers' generate() never sees it."""
    target = ctx.target
    if target.gguf is not None:
        raise NotEvaluated("a GGUF file has no generation_config.json")
    if target.generation_config is None:
        raise NotEvaluated("no generation_config.json")
    marker, token_id = ctx.end_marker()
    listed = _ids(target.generation_config.data)
    if token_id in listed or not any(token_id in ids for _, ids in _stop_sources(ctx)):
        return []  # listed, or nowhere at all (eos-not-end-marker reports that)
    return [
        Problem(
            f"{target.generation_config.label} lists eos_token_id {listed} without the end-of-turn marker "
            f"{marker!r} (id {token_id}): transformers' generate() stops only on these ids, so replies run on",
            f'set "eos_token_id": {[token_id, *listed]} in {target.generation_config.label}',
            target.generation_config.label,
        )
    ]


def check_double_bos(ctx: Context) -> list[Problem]:
    """``double-bos``: the template writes BOS and tokenizing the render with default settings adds another."""
    fmt, skeleton = ctx.fmt, ctx.skeleton
    bos = fmt.bos_token
    if not bos:
        raise NotEvaluated("the checkpoint declares no BOS token")
    bos_id = ctx.single_id(bos)
    if bos_id is None or not skeleton.prompt.startswith(bos):
        return []
    target = ctx.target
    if target.gguf is not None:
        if not target.gguf.add_bos_token:
            return []
        return [
            Problem(
                f"the template starts the prompt with BOS {bos!r} (id {bos_id}) and {target.path.name} sets "
                "tokenizer.ggml.add_bos_token, so llama.cpp adds a second one: the prompt starts "
                f"[{bos_id}, {bos_id}, ...]",
                "drop {{ bos_token }} from the template ("
                + _gguf_new_metadata(target, "--chat-template-file fixed.jinja")
                + ") or set tokenizer.ggml.add_bos_token to false",
                target.path.name,
            )
        ]
    default = ctx.tokenizer.backend.encode(skeleton.prompt).ids  # add_special_tokens=True: what tokenizer(text) does
    if default[:2] != [bos_id, bos_id]:
        return []
    return [
        Problem(
            f"the template writes BOS {bos!r} (id {bos_id}) and tokenizer(text) adds it again ({_tokenizer_file(ctx)} "
            f"post-processor): a pipeline that renders, then tokenizes, trains and serves [{bos_id}, {bos_id}, ...]",
            "tokenize rendered text with add_special_tokens=False (apply_chat_template(tokenize=True) and turnkit's "
            "encode do), or remove {{ bos_token }} from the template",
            _tokenizer_file(ctx),
        )
    ]


def _tokenizer_ids(tokenizer: Any) -> dict[int, str]:
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    return {token_id: token for token, token_id in vocab.items()}


def check_vocab(ctx: Context) -> list[Problem]:
    """``vocab-exceeds-model``: the tokenizer has ids beyond the model's embedding rows."""
    target = ctx.target
    if target.adapter is not None:
        if target.adapter.base_tokenizer is not None:
            raise NotEvaluated(
                "an adapter's new tokens are checked against its base by adapter-missing-modules-to-save"
            )
        if saves_embeddings(ctx):
            return []  # modules_to_save holds the whole resized embedding: every id has its row in the adapter
    if target.gguf is not None:
        count, rows = target.gguf.token_count, target.gguf.embedding_rows
        if count is None or rows is None:
            raise NotEvaluated(f"{target.path.name} lists no tokens or no token_embd tensor")
        if count <= rows:
            return []
        return [
            Problem(
                f"{target.path.name} holds {count} tokens but token_embd has {rows} rows: ids {rows}..{count - 1} "
                "have no embedding",
                "convert the model again from a folder whose embeddings were resized to the tokenizer",
                target.path.name,
            )
        ]
    if target.config is None:
        raise NotEvaluated("no config.json to read the embedding size from")
    data = target.config.data
    size = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int):
        raise NotEvaluated(f"{target.config.label} has no vocab_size")
    ids = _tokenizer_ids(ctx.tokenizer)
    beyond = sorted(i for i in ids if i >= size)
    if not beyond:
        return []
    shown = ", ".join(f"{i} {ids[i]!r}" for i in beyond[:5]) + (" ..." if len(beyond) > 5 else "")
    return [
        Problem(
            f"{_tokenizer_file(ctx)} has {len(beyond)} token ids at or above {target.config.label} vocab_size {size} "
            f"({shown}): the model has no embedding row for them (an index error, or garbage on some kernels)",
            "model.resize_token_embeddings(len(tokenizer)) and save the model again (config.json's vocab_size then "
            "follows); with LoRA, also train the new rows (modules_to_save)",
            target.config.label,
        )
    ]


def check_non_special(ctx: Context) -> list[Problem]:
    """``non-special-marker``: the template writes an added token not flagged special."""
    tokenizer = ctx.tokenizer
    markers = dict.fromkeys([*ctx.skeleton.markers, *tool_markers(ctx.fmt, tokenizer)])
    problems = []
    for marker in markers:
        token = tokenizer.added.get(marker)
        if token is None or token.special:
            continue
        problems.append(
            Problem(
                f"{template_file(ctx)} writes {marker!r} (id {token.id}), an added token not flagged special in "
                f"{_tokenizer_file(ctx)}: tokenizer(text, split_special_tokens=True) still turns {marker!r} typed in "
                f"user text into id {token.id}",
                "encode with turnkit (it disables every added token for data), or strip/escape the marker in "
                f"untrusted text; flagging it special in {_tokenizer_file(ctx)} also makes decode("
                "skip_special_tokens=True) drop it from replies",
                _tokenizer_file(ctx),
            )
        )
    return problems


def _pad_source(ctx: Context) -> tuple[str, str]:
    """``(file, field)`` where the pad token is declared."""
    target = ctx.target
    if target.gguf is not None:
        return target.path.name, "tokenizer.ggml.padding_token_id"
    return (target.tokenizer_config.label if target.tokenizer_config else "tokenizer_config.json"), "pad_token"


def _spare_pad(ctx: Context, marker: str) -> str | None:
    """A token to pad with instead: one named like a pad token, else the unknown token, else a plain EOS."""
    specials = [t.content for t in ctx.tokenizer.added.values() if t.special]
    tokens = ctx.fmt.special_tokens
    candidates = [t for t in specials if "pad" in t.lower()] + [tokens.get("unk_token"), tokens.get("eos_token")]
    return next((t for t in candidates if t and t != marker and t in ctx.tokenizer.added), None)


def check_pad(ctx: Context) -> list[Problem]:
    """``pad-is-end-marker``: the pad token is the end-of-turn marker."""
    pad = ctx.fmt.special_tokens.get("pad_token")
    if not pad:
        raise NotEvaluated("the checkpoint declares no pad token")
    marker, token_id = ctx.end_marker()
    if pad != marker:
        return []
    spare = _spare_pad(ctx, marker)
    file, field = _pad_source(ctx)
    if ctx.target.gguf is not None:
        how = _gguf_new_metadata(ctx.target, f"--special-token padding {shlex.quote(spare or '<token>')}")
    else:
        how = f"set pad_token {spare!r}" if spare else "add a pad token of its own ('<|pad|>') and set pad_token"
        how += f" in {file}"
    return [
        Problem(
            f"the pad token ({file} {field}) is the end-of-turn marker {marker!r} (id {token_id}): a collator "
            f"that sets labels to -100 where input_ids == pad_token_id masks every {marker!r}, so the model never "
            "learns to stop",
            f"{how} (a token the template never writes), or mask by turns (turnkit prepare never masks by pad id)",
            file,
        )
    ]


def check_forgery(ctx: Context) -> list[Problem]:
    """``forgeable-tokenizer``: how many control ids a forged turn in user text produces, plain vs turnkit."""
    result = run_forgery(ctx.fmt, ctx.tokenizer, ctx.skeleton)
    ctx.forgery = result
    if sum(result.turnkit.values()):
        return [
            Problem(
                f"turnkit's encode let a forged turn through: {result.summary()} (a turnkit bug: please report it)",
                "report this checkpoint to turnkit; until fixed, strip markers from untrusted text",
                severity=Severity.ERROR,
            )
        ]
    if not sum(result.plain.values()):
        return []
    return [
        Problem(
            f"a user who types {result.text!r} gets real control tokens through the usual path: {result.summary()}",
            "encode conversations with turnkit (fmt.encode, turnkit prepare, turnkit serve) or tokenize untrusted "
            "text on its own with split_special_tokens=True and insert marker ids yourself; run `turnkit doctor --ci` "
            "in CI",
        )
    ]
