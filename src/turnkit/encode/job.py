"""Stage 1 of an encode: a conversation checked, prepared and rendered with provenance, waiting for its token ids.

Rendering is cheap (tens of microseconds) and tokenizing is most of the cost, so the stages are separate objects:
``encode_batch`` renders one chunk of conversations while the tokenizer's threads encode the previous one. A
:class:`Job` is everything the later stages (tokenize, check, attribute, mask) need from the first.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from turnkit.encode.controls import MissingMarkers, check_roles, find_controls
from turnkit.encode.coverage import unrendered
from turnkit.encode.marking import DataMarker, Prepared, message_of
from turnkit.encode.options import EncodeOptions, Tools
from turnkit.errors import EncodeError, MessageError, TrustedDataWarning
from turnkit.messages import Conversation, normalize_conversation, plain_data
from turnkit.template.chat_template import ChatTemplate
from turnkit.template.content import content_format
from turnkit.template.render import Rendered, continuation_end, mark_continuation
from turnkit.template.splice import MessageShapes, SplicingRenderer
from turnkit.template.tools import tool_schemas
from turnkit.tokenizer import TokenizerBinding

__all__ = ["Job", "Stage", "render_context", "take_train_flags"]

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@lru_cache(maxsize=64)
def _has_generation_blocks(source: str) -> bool:
    return bool(_GENERATION_TAG.search(source))


@dataclass
class Job:
    """A conversation after stage 1 (rendered), waiting for its token ids."""

    chat: list[dict[str, Any]]
    flags: dict[int, bool]
    prepared: Prepared
    rendered: Rendered
    text: str
    controls: list[tuple[int, int, str]]
    use_blocks: bool
    add_generation_prompt: bool  # a serving prompt: a new assistant turn's header, or an open final message
    template_name: str | None
    tools: Tools | None
    variables: dict[str, Any]
    options: EncodeOptions
    source: str  # the template text the render used
    #: The sources of the render's data: which fields of which message the template wrote (see encode.coverage).
    sources: frozenset[int]
    #: (message index, field) of assistant data the template left out.
    unrendered: tuple[tuple[int, str], ...]
    #: The shape of each prepared message, shared by the renders of the conversation's beginnings (None: no splicing).
    shapes: MessageShapes | None = None
    #: Turns rendered as the last message, by index (renders that mask location and the prefix check share).
    generated: dict[int, str] = field(default_factory=dict)


def render_context(
    template: ChatTemplate, prepared: Prepared, messages: list[Any], *, documents: Any, add_generation_prompt: bool
) -> dict[str, Any]:
    """What a template is given for ``messages`` (prepared data): the job's tools, variables and special tokens."""
    return {
        "messages": messages,
        "tools": prepared.tools,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
        **template.special_tokens,
        **prepared.variables,
    }


def take_train_flags(chat: list[dict[str, Any]]) -> dict[int, bool]:
    """Remove turnkit's per-message ``train`` flags (templates never see them) and return them by message index."""
    flags = {}
    for index, message in enumerate(chat):
        if "train" in message:
            value = message.pop("train")
            if not isinstance(value, bool):
                raise MessageError("train must be true or false", index=index, field="train")
            if value and message["role"] != "assistant":
                raise MessageError("only assistant turns can be trained", index=index, field="train")
            flags[index] = value
    return flags


class Stage:
    """Stage 1 for one template and tokenizer: normalise, check, prepare the data, render, find the control tokens."""

    def __init__(self, template: ChatTemplate, binding: TokenizerBinding) -> None:
        self.template = template
        self.binding = binding
        self.marker = DataMarker(binding)
        #: Renders reused across conversations of one shape (off where the marker needs every reserved character).
        self.renders = SplicingRenderer(enabled=self.marker.leaves_sentinels_free)
        bos_eos = (template.special_tokens.get("bos_token"), template.eos_token)
        self.missing = MissingMarkers(binding, [*template.end_markers, *(t for t in bos_eos if isinstance(t, str))])

    def __call__(self, messages: Conversation, options: EncodeOptions, *, stacklevel: int = 1) -> Job:
        tools, documents, template_name = options.tools, options.documents, options.template_name
        add_generation_prompt = options.add_generation_prompt
        source = self.template.source(template_name, tools=tools)
        chat = normalize_conversation(messages, content_format=content_format(source))
        flags = take_train_flags(chat)
        check_roles(self.binding, chat)
        final = None
        if options.continue_final_message:  # the sentinel is data: it is prepared, rendered and cut away as data
            field = options.continue_final_message
            final = mark_continuation(chat, source, field if isinstance(field, str) else "content")
        if options.trust_data:
            warnings.warn(
                "trust_data=True: control-token strings inside the data are encoded as control tokens; never use it "
                "for data a user or a model wrote",
                TrustedDataWarning,
                stacklevel=stacklevel + 1,
            )
        schemas = plain_data(tool_schemas(tools))
        docs = plain_data(list(documents)) if documents is not None else None
        variables = plain_data(dict(options.template_kwargs))
        prepared = self.marker.prepare(chat, schemas, docs, variables, neutralize=not options.trust_data)
        has_blocks = _has_generation_blocks(source)
        if options.masks == "generation" and not has_blocks:
            raise EncodeError("masks='generation' but the template has no {% generation %} blocks")
        use_blocks = has_blocks and options.masks != "turns"
        context = render_context(
            self.template,
            prepared,
            prepared.chat,
            documents=prepared.documents,
            add_generation_prompt=add_generation_prompt,
        )
        shapes = MessageShapes(prepared.chat) if self.renders.enabled else None
        rendered = self.renders.render(
            source, context, limits=self.template.limits, track_generation=use_blocks, shapes=shapes
        )
        if final is not None:
            rendered = rendered.up_to(continuation_end(self.marker.restore(rendered.text), final))
        sources = frozenset(s for a, b, s in rendered.data_spans if b > a)
        # the spans by message index from here on; the skeleton (field sources) stays for the history renders' proofs
        rendered = replace(rendered, data_spans=tuple((a, b, message_of(s)) for a, b, s in rendered.data_spans))
        self.missing.check(rendered.text, rendered.data_spans, stacklevel=stacklevel + 1, skeleton=rendered.skeleton)
        controls = find_controls(self.binding, rendered.text)
        text = self.marker.restore(rendered.text) if prepared.broken else rendered.text
        return Job(
            chat,
            flags,
            prepared,
            rendered,
            text,
            controls,
            use_blocks,
            add_generation_prompt or bool(options.continue_final_message),
            template_name,
            tools,
            variables,
            options,
            source,
            sources,
            unrendered(chat, sources, text, rendered.data_spans),
            shapes,
        )
