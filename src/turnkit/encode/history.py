"""What the template writes around a turn when it is rendered on its own: headers, serving prompts, rewritten history.

Masks without ``{% generation %}`` blocks locate a trained turn from renders of the conversation cut short: the
generation-prompt header (``<|im_start|>assistant\\n``) is the difference between the messages before the turn rendered
with and without the generation prompt; where the header cannot be found, the serving prompt itself marks the start.

The same renders tell when one example cannot train a turn in the context the model sees at inference, the two checks
of :func:`turnkit.encode.prefix.check_prefix_stable` (whose helpers are used here, so that ``encode`` refuses exactly
what the prefix check reports):

* the serving prompt (the messages before the turn, with the generation prompt) must be a prefix of the full render;
* the turn rendered as the last message (as the model generated it) must be a prefix too. Templates that rewrite
  history fail this: Qwen3 drops the reasoning of a turn once a later user turn follows, and without reasoning it
  writes an empty ``<think>\\n\\n</think>\\n\\n`` before the *last* assistant turn only. Training such turns in the
  full conversation teaches two shapes of reply at once; ``split_turns=True`` trains each in its own context.

These renders are most of an encode's cost for a template without ``{% generation %}`` blocks (one per trained turn
followed by later messages), so where the job's data needed no marker broken they go through a
:class:`~turnkit.template.splice.SplicingRenderer` over the job's prepared data, as stage 1's render does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from turnkit.encode.job import render_context
from turnkit.encode.prefix import TurnCheck, as_generated, compare_turn, serving_prompt
from turnkit.errors import EncodeError, TemplateError, TurnkitError
from turnkit.template.chat_template import ChatTemplate
from turnkit.template.splice import SplicingRenderer

if TYPE_CHECKING:
    from turnkit.encode.job import Job

__all__ = ["History"]

#: The conversation whose generation prompt gives the header where the turn's own earlier messages cannot.
_PROBE = [{"role": "user", "content": "Hello."}]


class History:
    """Renders of a conversation cut short, for one template; the generation-prompt header is cached per set-up."""

    def __init__(self, template: ChatTemplate, *, splicing: bool = True) -> None:
        self.template = template
        self._headers: dict[tuple[str, bool, str], str | None] = {}
        self.renders = SplicingRenderer(enabled=splicing)

    def render(self, job: Job, chat: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
        """The render of ``chat`` (the job's first messages) with the job's tools, template and variables (but not its
        documents), as ``ChatTemplate.render`` gives it."""
        prepared = job.prepared
        if not prepared.broken and all(a is b for a, b in zip(chat, job.chat, strict=False)):
            # Nothing was broken, so the prepared data is the job's data, tagged: splice.
            messages = prepared.chat[: len(chat)]
            context = render_context(
                self.template, prepared, messages, documents=None, add_generation_prompt=add_generation_prompt
            )
            limits = self.template.limits
            return self.renders.render(
                job.source, context, limits=limits, track_generation=False, shapes=job.shapes
            ).text
        return self.template.render(
            chat,
            tools=job.tools,
            add_generation_prompt=add_generation_prompt,
            template_name=job.template_name,
            template_kwargs=job.variables,
        ).text

    def header(self, job: Job, index: int) -> str | None:
        """The generation-prompt header (``<|im_start|>assistant\\n``), from the template, cached per set-up.

        It is what the generation prompt adds to the messages before the turn; for a turn with none before it (a
        conversation that opens with the assistant's greeting) or whose messages before it do not render alone (a
        tool result first), what it adds to one user message. Not what it adds to no message at all: a template that
        writes a default system prompt when the first message is not a system message writes none for an empty
        conversation, so that difference would hold the system prompt (and train it).
        """
        tools, variables = job.tools, job.variables
        key = (job.source, tools is not None, repr(sorted(variables.items())) if variables else "")
        if key in self._headers:
            return self._headers[key]
        rendered = False
        for prefix in (job.chat[:index], _PROBE):
            if not prefix:
                continue
            try:
                with_prompt = self.render(job, prefix, add_generation_prompt=True)
                without = self.render(job, prefix)
            except TemplateError:
                continue  # not renderable alone; the probe, or another turn, may be
            rendered = True
            if with_prompt.startswith(without) and len(with_prompt) > len(without):
                self._headers[key] = header = with_prompt[len(without) :]
                return header
        if rendered:
            self._headers[key] = None  # the generation prompt is not an addition: the serving prompt locates turns
        return None

    def prompt_start(self, job: Job, index: int) -> int:
        """Where turn ``index`` starts: the end of its serving prompt, which must be a prefix of the full render."""
        prompt = serving_prompt(self._renderer(job), job.chat, index)
        check = compare_turn(index, job.text, prompt=prompt)
        if not check.prompt_stable and index == len(job.chat) - 1:
            # The turn is already the last message (as each split_turns example is): splitting cannot help.
            raise EncodeError(
                f"message {index} cannot be trained in its inference context by any example: the prompt the model is "
                "served for it (the conversation before it and the generation prompt) is not how the template writes "
                "the turn itself, so the trained text would never follow the served prompt; leave this turn out "
                f'("train": false) or use a template whose generation prompt starts the turn; {_where(check)}'
            )
        if not check.prompt_stable:
            raise EncodeError(
                f"the template is not prefix-stable at message {index}: the prompt the model sees for this turn is "
                "not a prefix of the full render, so one example cannot train it in its inference context; encode "
                f"with split_turns=True (see check_prefix_stable); {_where(check)}"
            )
        return len(prompt)

    def opening_reply_start(self, job: Job, after_header: int | None, first: int | None) -> int:
        """Where the reply of a conversation that opens with the assistant (a bot's greeting) starts: right after its
        generation-prompt header (``after_header``, where it was found), never before the reply's first character
        (``first``) when that is all that can be told.

        The text before an opening reply is not how the model is ever served for it: a template may write its default
        system prompt before the first message (SmolLM2, Qwen2.5), or into the first message whatever its role
        (Gemma-based ones, which have no system turn), or no header at all before a first assistant message; none of
        it is the reply's. What the template writes between the header and the reply when a user message comes first
        (Qwen3's empty ``<think></think>``) is the reply's, and stays trained.
        """
        text = job.text
        if after_header is None:
            after_header = self._empty_prompt_end(job)
        if first is None:
            if after_header is not None:
                return after_header
            raise EncodeError(
                "cannot tell where the reply of message 0 starts: the conversation opens with an assistant message "
                "that holds no text, and the template's generation prompt is not found before it; leave the turn out "
                '("train": false) or start the conversation with a user or system message'
            )
        if after_header is None or after_header > first:
            return first
        gap = text[after_header:first]
        if not gap.strip():
            return after_header
        header = self.header(job, 0)
        reference = None
        with contextlib.suppress(TurnkitError):
            reference = self.render(job, [*_PROBE, job.chat[0]])
        if reference is not None and header:
            after = reference.rfind(header)
            at = reference.find(text[first : first + 16], after + len(header)) if after >= 0 else -1
            if at >= 0:
                written = reference[after + len(header) : at]
                if gap.endswith(written):
                    return first - len(written)
        return first

    def _empty_prompt_end(self, job: Job) -> int | None:
        """The end of the empty conversation's serving prompt where the full render begins with it (and it is more
        than the empty render: a generation prompt), else ``None``."""
        try:
            prompt = self.render(job, [], add_generation_prompt=True)
            empty = self.render(job, [])
        except TurnkitError:
            return None
        return len(prompt) if prompt != empty and job.text.startswith(prompt) else None

    def ending(self, job: Job, index: int) -> str:
        """The render of the conversation up to turn ``index``: where the template ends the turn when it is last."""
        return self._generated(job, index)

    def check_as_generated(self, job: Job, selected: Iterable[int]) -> None:
        """Each trained turn followed by later messages must render as the model generated it (as the last message).

        The last message is its own generated form. For another, where the conversation's render was spliced, the
        skeleton of the conversation up to the turn proves it once for every conversation of these two shapes
        (:meth:`~turnkit.template.splice.SplicingRenderer.proves_prefix`); otherwise the turn costs one render.
        """
        chat = job.chat
        for index in sorted(selected):
            if index >= len(chat) - 1 or self._proven_as_generated(job, index):
                continue
            check = compare_turn(index, job.text, generated=self._generated(job, index))
            if not check.turn_stable:
                message = chat[index]
                why = (
                    "its reasoning is dropped"
                    if "reasoning_content" in message or "<think>" in str(message.get("content", ""))
                    else "the template writes the last assistant turn differently"
                )
                raise EncodeError(
                    f"the template is not prefix-stable at message {index}: it renders this turn differently once "
                    f"later messages follow ({why}), so training it in the full conversation teaches the wrong reply; "
                    f"encode with split_turns=True (see check_prefix_stable); {_where(check)}"
                )

    def _proven_as_generated(self, job: Job, index: int) -> bool:
        """Whether splicing shows, without a render, that turn ``index`` rendered as the last message begins the full
        render (only where the data needed no marker broken: then the renders are of the job's prepared data)."""
        prepared = job.prepared
        if prepared.broken or job.shapes is None:
            return False
        context = render_context(
            self.template, prepared, prepared.chat[: index + 1], documents=None, add_generation_prompt=False
        )
        limits = self.template.limits
        return self.renders.proves_prefix(job.source, context, shapes=job.shapes, of=job.rendered, limits=limits)

    def _generated(self, job: Job, index: int) -> str:
        """Turn ``index`` rendered as the last message, once per job (mask location and the check both need it)."""
        found = job.generated.get(index)
        if found is None:
            found = job.generated[index] = as_generated(self._renderer(job), job.chat, index)
        return found

    def _renderer(self, job: Job) -> Any:
        def render(chat: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
            return self.render(job, chat, add_generation_prompt=add_generation_prompt)

        return render


def _where(check: TurnCheck) -> str:
    """Where a turn breaks, on one line (a command line prints an error as one line)."""
    what = "the serving prompt" if not check.prompt_stable else "the turn as generated"
    return (
        f"at character {check.offset}, {what} reads {check.expected_excerpt!r} and the full render "
        f"{check.render_excerpt!r}"
    )
