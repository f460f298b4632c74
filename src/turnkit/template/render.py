"""Render a conversation through a chat template, with the semantics of ``transformers.apply_chat_template``.

The steps, in transformers' order: validate and normalise the messages (:mod:`turnkit.messages`; content sent as
parts is given in the shape the template reads, :mod:`turnkit.template.content`), turn tools given as functions
into schemas, rebuild every input as plain JSON data, pass the special tokens as variables (template keyword
arguments override them), handle ``continue_final_message`` with the same sentinel trick, and render in the sandbox
(:mod:`turnkit.template.sandbox`) under a time limit and a size limit.

Every failure comes out as a :class:`~turnkit.TurnkitError`: the template's own ``raise_exception`` message as
:class:`~turnkit.TemplateError`, sandbox violations as :class:`~turnkit.TemplateSecurityError`, runaway templates as
:class:`~turnkit.TemplateLimitError`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jinja2
from jinja2.sandbox import SecurityError

from turnkit.errors import (
    MessageError,
    Overrun,
    TemplateError,
    TemplateLimitError,
    TemplateRaised,
    TemplateSecurityError,
    TurnkitError,
)
from turnkit.messages import REASONING_FIELDS, Conversation, normalize_conversation, plain_data
from turnkit.template.content import content_format
from turnkit.template.sandbox import DEFAULT_MAX_OUTPUT_CHARS, RenderState, compile_template, render_state
from turnkit.template.taint import SOURCE_DOCUMENTS, SOURCE_TOOLS, DataStr, Span, tagged
from turnkit.template.tools import tool_schemas
from turnkit.template.watchdog import time_limit

__all__ = [
    "RenderLimits",
    "Rendered",
    "continuation_end",
    "mark_continuation",
    "render_prepared",
    "render_template",
    "run_compiled",
]

_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


@dataclass(frozen=True, slots=True)
class RenderLimits:
    """How long one render may run and how much text it may build. ``timeout_s=None`` disables the time limit."""

    timeout_s: float | None = 2.0
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS


@dataclass(frozen=True, slots=True)
class Rendered:
    """A render, the character spans of its ``{% generation %}`` blocks (when tracked), and the spans of data
    ``(start, end, source)`` (when rendered with provenance). ``skeleton``: the skeleton a spliced render was filled
    from (:mod:`turnkit.template.splice`), else None; not part of the render's value."""

    text: str
    generation_spans: tuple[tuple[int, int], ...] = ()
    data_spans: tuple[Span, ...] = ()
    skeleton: Any = field(default=None, compare=False, repr=False)

    def up_to(self, end: int) -> Rendered:
        """The render cut at character ``end`` (an open final message), its spans clipped to the cut."""
        return Rendered(
            self.text[:end],
            tuple((a, min(b, end)) for a, b in self.generation_spans if a < end),
            tuple((a, min(b, end), s) for a, b, s in self.data_spans if a < end),
        )


def _template_line(exc: BaseException) -> int | None:
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _at(exc: BaseException) -> str:
    line = _template_line(exc)
    return f" (template line {line})" if line else ""


def _run(template: jinja2.Template, context: dict[str, Any], limits: RenderLimits, track_generation: bool) -> Rendered:
    budget = limits.max_output_chars
    chunks: list[str] = []
    data_spans: list[Span] = []
    state = RenderState(budget, []) if track_generation else RenderState(budget)
    token = render_state.set(state)
    try:
        with time_limit(limits.timeout_s):
            total = 0
            try:
                # The compiled render function itself, not Template.generate: one generator layer less per chunk.
                for chunk in template.root_render_func(template.new_context(context)):
                    if type(chunk) is DataStr:
                        data_spans.extend((a + total, b + total, src) for a, b, src in chunk._spans)
                    total += len(chunk)
                    state.offset = total
                    if total > budget:
                        raise TemplateLimitError(
                            f"the template rendered more than {budget:,} characters; stopped "
                            "(raise max_output_chars if this is a genuine render)"
                        )
                    chunks.append(chunk)
            except TurnkitError:
                raise
            except Exception:  # noqa: BLE001 - only to translate line numbers; re-raised at once
                template.environment.handle_exception()  # re-raises with template line numbers in the traceback
    finally:
        render_state.reset(token)
    return Rendered("".join(chunks), tuple(state.spans or ()), tuple(data_spans))


_NO_ATTRIBUTE = re.compile(r"'dict object' has no attribute '([^']+)'")
#: Message fields a template may read without checking that they are there.
_MESSAGE_FIELDS = frozenset({"content", "tool_calls", "tool_call_id", "name", *REASONING_FIELDS})


def _missing_field(exc: jinja2.UndefinedError, messages: Any) -> MessageError | None:
    """The template read a message field that a message lacks (``[{"role": "user"}]``): say which message and field,
    instead of jinja's ``'dict object' has no attribute 'content'``."""
    match = _NO_ATTRIBUTE.fullmatch(str(exc.message or ""))
    if match is None or match.group(1) not in _MESSAGE_FIELDS or not isinstance(messages, list):
        return None
    field = match.group(1)
    for index, message in enumerate(messages):
        if isinstance(message, Mapping) and field not in message:
            return MessageError(f"missing, and the chat template reads it{_at(exc)}", index=index, field=field)
    return None


def run_compiled(
    template: jinja2.Template, context: dict[str, Any], limits: RenderLimits, track_generation: bool
) -> Rendered:
    """Run a compiled template on a prepared context, every failure as a :class:`~turnkit.TurnkitError`."""
    try:
        return _run(template, context, limits, track_generation)
    except TurnkitError:
        raise
    except Overrun:
        raise TemplateLimitError(
            f"the template ran longer than {limits.timeout_s} s and was stopped (an endless or huge loop?)"
        ) from None
    except TemplateRaised as exc:
        raise TemplateError(str(exc), template_message=str(exc)) from None
    except SecurityError as exc:
        raise TemplateSecurityError(f"the chat template was stopped by the sandbox{_at(exc)}: {exc}") from None
    except RecursionError:
        raise TemplateLimitError("the template recursed too deeply (a macro calling itself?)") from None
    except OverflowError as exc:
        raise TemplateLimitError(f"the template computed a value too large{_at(exc)}: {exc}") from None
    except MemoryError:
        raise TemplateLimitError("the template ran out of memory") from None
    except jinja2.UndefinedError as exc:
        missing = _missing_field(exc, context.get("messages"))
        if missing is not None:
            raise missing from None
        raise TemplateError(f"the chat template failed{_at(exc)}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a template is a program: any Python error can come out of it
        raise TemplateError(f"the chat template failed{_at(exc)}: {type(exc).__name__}: {exc}") from None


def mark_continuation(chat: list[dict[str, Any]], source: str, field: str) -> str:
    """Append the sentinel to the final message (as transformers does) and return the text being continued; the
    render is then cut where the sentinel appears (:func:`continuation_end`)."""
    final = chat[-1].get(field)
    if final is None:
        raise MessageError(f"continue_final_message is set but the final message has no {field!r}", index=len(chat) - 1)
    fields = [field]
    if field in REASONING_FIELDS:
        fields = [f for f in REASONING_FIELDS if chat[-1].get(f) == final]
    if not any(f in source for f in fields):
        raise TemplateError(f"continue_final_message: the chat template never reads the field {field!r}")
    if isinstance(final, list | tuple):
        for block in reversed(final):
            if "text" in block:
                text = block["text"]
                block["text"] = text + _CONTINUE_TAG
                return text
        raise MessageError(
            "continue_final_message is set but the final message has no text part to continue", index=len(chat) - 1
        )
    for f in fields:
        chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    return final


def continuation_end(rendered: str, final: str) -> int:
    """Where a render of a conversation marked by :func:`mark_continuation` ends: at the sentinel (and, when the
    template stripped the text after it, before the whitespace the final message ended with)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in rendered or tag not in rendered:
        raise TemplateError(
            "continue_final_message is set but the final message does not appear in the render (the template "
            "drops or rewrites part of it), so the reply cannot continue it"
        )
    at = rendered.rindex(tag)
    if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return at
    return len(rendered[:at].rstrip())


def render_prepared(
    source: str,
    context: dict[str, Any],
    *,
    limits: RenderLimits,
    track_generation: bool = False,
    provenance: bool = True,
) -> Rendered:
    """Render an already prepared context (``messages``, ``tools``, ``documents``, ``add_generation_prompt`` and the
    variables), normally with provenance: the encoder's entry point."""
    template = compile_template(source, provenance=provenance)
    return run_compiled(template, context, limits, track_generation)


def render_template(
    source: str,
    messages: Conversation,
    *,
    tools: Sequence[Mapping[str, Any] | Callable[..., Any]] | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    variables: Mapping[str, Any] | None = None,
    limits: RenderLimits = RenderLimits(),
    track_generation: bool = False,
    with_data_spans: bool = False,
    **template_kwargs: Any,
) -> Rendered:
    """Render ``messages`` through the template text ``source``.

    ``variables`` are the template's standard variables (special tokens such as ``bos_token``); ``template_kwargs``
    override them, as in transformers. ``continue_final_message`` may name the field to continue (``"content"`` when
    ``True``; ``"reasoning_content"`` continues a reasoning block). ``with_data_spans`` renders with provenance and
    fills ``Rendered.data_spans`` (which text came from the messages, tools and documents), for a display that sets
    apart what the template wrote; data is not neutralised here (the encoder does that).
    """
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt exclude each other: the first continues the last "
            "message, the second opens a new assistant turn"
        )
    template = compile_template(source, provenance=with_data_spans)
    # a picture's part is the template's to show, as transformers shows it; encode refuses it (no ids can hold it)
    chat = normalize_conversation(messages, content_format=content_format(source), media=True)
    schemas = plain_data(tool_schemas(tools))
    if documents is not None:
        for index, document in enumerate(documents):
            if not isinstance(document, Mapping):
                raise MessageError(f"documents[{index}] must be a dict (with 'title' and 'text')")
        documents = plain_data(list(documents))
    kwargs = plain_data({**(variables or {}), **template_kwargs})

    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = mark_continuation(chat, source, field)

    if with_data_spans:
        chat = [{k: v if k == "role" else tagged(v, n) for k, v in m.items()} for n, m in enumerate(chat)]
        schemas, documents = tagged(schemas, SOURCE_TOOLS), tagged(documents, SOURCE_DOCUMENTS)
    context = {
        "messages": chat,
        "tools": schemas,
        "documents": documents,
        "add_generation_prompt": add_generation_prompt,
        **kwargs,
    }
    rendered = run_compiled(template, context, limits, track_generation)
    if final is not None:
        return rendered.up_to(continuation_end(rendered.text, final))
    return rendered
