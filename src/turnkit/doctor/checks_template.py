"""Checks of the template itself: is there one, do its copies agree, can it open a reply, does it rewrite history.

Each check is a small function ``(Context) -> list[Problem]``; :mod:`turnkit.doctor.registry` gives it its id and
severity. A check raises :class:`NotEvaluated` when the target lacks what it needs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from turnkit.doctor.context import Context
from turnkit.doctor.findings import Problem
from turnkit.doctor.probe import ASSISTANT_1, PROBE_TOOL, USER_1, probe_conversation
from turnkit.doctor.target import TemplateSource
from turnkit.errors import NotEvaluated, TemplateError, TurnkitError
from turnkit.format import ChatFormat
from turnkit.template.sources import TemplateSet

__all__ = [
    "check_generation_prompt",
    "check_prefix_stable",
    "check_template_drift",
    "check_template_invalid",
    "check_template_missing",
    "check_tools_ignored",
    "check_tools_unreadable",
]


def template_file(ctx: Context) -> str:
    """The file the effective template comes from (as transformers picks it: ``.jinja`` first)."""
    sources = ctx.target.template_sources
    return sources[0].file if sources else ctx.target.label(ctx.target.path)


def check_template_missing(ctx: Context) -> list[Problem]:
    """``template-missing``: no chat template anywhere; a base model."""
    target = ctx.target
    if target.fmt is not None or target.template_invalid:
        return []
    where = (
        f"{target.path.name} has no tokenizer.chat_template in its metadata"
        if target.kind == "gguf"
        else "no chat_template.jinja, no additional_chat_templates/ and no chat_template in tokenizer_config.json"
    )
    return [
        Problem(
            f"{target.given} has no chat template ({where}): every runtime falls back to a guess, and "
            "apply_chat_template raises",
            "a base model: add ChatML and its tokens with `turnkit add-chatml`; a fine-tune of an instruct model: "
            "copy that model's chat_template.jinja (and its special tokens) next to the weights",
            None if target.kind == "gguf" else "tokenizer_config.json",
        )
    ]


def check_template_invalid(ctx: Context) -> list[Problem]:
    """``template-invalid``: a template is there but does not compile."""
    target = ctx.target
    if not target.template_invalid:
        return []
    return [
        Problem(
            f"{template_file(ctx)}: {target.no_template}",
            "fix the Jinja at the line named (render it with `turnkit render --model PATH conv.json` to check)",
            template_file(ctx),
        )
    ]


def _first_difference(a: str, b: str) -> tuple[int, str, str]:
    """``(line number, line of a, line of b)`` of the first line where two renders differ."""
    lines_a, lines_b = a.split("\n"), b.split("\n")
    for number, (left, right) in enumerate(zip(lines_a, lines_b, strict=False), start=1):
        if left != right:
            return number, left, right
    number = min(len(lines_a), len(lines_b)) + 1
    return number, "\n".join(lines_a[number - 1 :]), "\n".join(lines_b[number - 1 :])


def _around(left: str, right: str, width: int = 60) -> tuple[str, str]:
    """Both lines cut to a window around their first differing character, so the difference is always shown."""
    column = next((i for i, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), min(len(left), len(right)))
    start = max(0, column - width // 2)

    def cut(text: str) -> str:
        piece = text[start : start + width]
        return repr(("..." if start else "") + piece + ("..." if start + width < len(text) else ""))

    return cut(left), cut(right)


def _renders(fmt: ChatFormat, source: str, probes: list[list[dict[str, str]]]) -> list[str] | str:
    """Each probe rendered by one template source, then the serving prompt (or why the source fails)."""
    try:
        other = replace(fmt, templates=TemplateSet({"default": source}))  # same special tokens and limits
        prompt = probes[-1][: next(i for i, m in enumerate(probes[-1]) if m["role"] == "user") + 1]
        return [*(other.render(m) for m in probes), other.render(prompt, add_generation_prompt=True)]
    except TurnkitError as exc:
        return f"fails: {exc}"


def _users(source: TemplateSource, sources: list[TemplateSource]) -> str:
    """Who reads this copy of the template (transformers prefers the ``.jinja``; llama.cpp's converter the JSON)."""
    files = {s.file.rsplit("/", 1)[-1] for s in sources}
    name = source.file.rsplit("/", 1)[-1]
    if name.endswith(".gguf"):
        return "what llama.cpp serves from that file, and what Ollama derives its template from"
    if name == "chat_template.jinja":
        used = "what transformers and vLLM use (.jinja wins)"
        return used if "tokenizer_config.json" in files else used + " and what convert_hf_to_gguf.py embeds in a GGUF"
    if name == "tokenizer_config.json":
        converter = "what llama.cpp's convert_hf_to_gguf.py embeds in the GGUFs it makes"
        return converter if "chat_template.jinja" in files else "what transformers and vLLM use, and " + converter
    return "what AutoProcessor reads"


def check_template_drift(ctx: Context) -> list[Problem]:
    """``template-drift``: the copies of the template render the probe differently."""
    sources = ctx.target.template_sources
    if len(sources) < 2:
        raise NotEvaluated(f"one template source only ({sources[0].label if sources else 'none'}): nothing to compare")
    fmt = ctx.fmt
    probes = [ctx.skeleton.messages]
    if ctx.skeleton.messages[0]["role"] == "system":  # a default system prompt shows only without one
        probes.append(probe_conversation(system=False))
    reference = sources[0]
    expected = _renders(fmt, reference.text, probes)
    problems = []
    for other in sources[1:]:
        if other.text == reference.text:
            continue
        got = _renders(fmt, other.text, probes)
        if got == expected:
            continue
        if isinstance(expected, str) or isinstance(got, str):
            detail = f"{reference.label} {expected if isinstance(expected, str) else 'renders'}; {other.label} " + (
                got if isinstance(got, str) else "renders"
            )
        else:
            which = next(i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b)
            line, left, right = _first_difference(expected[which], got[which])
            what = (
                ("the probe conversation", "the probe without a system message")[which]
                if which < len(probes)
                else ("the serving prompt (add_generation_prompt=True)")
            )
            shown = _around(left, right)
            detail = f"{what} differs at line {line}: {shown[0]} vs {shown[1]}"
        problems.append(
            Problem(
                f"{reference.label} ({_users(reference, sources)}) and {other.label} ({_users(other, sources)}) "
                f"disagree: {detail}",
                f"keep one template: copy {reference.label} over the other copy (or delete the stale one); for a "
                f"GGUF, `gguf-new-metadata IN.gguf OUT.gguf --chat-template-file chat_template.jinja`",
                other.file,
            )
        )
    return problems


def check_generation_prompt(ctx: Context) -> list[Problem]:
    """``no-generation-prompt``: ``add_generation_prompt=True`` adds nothing, so serving cannot open a reply."""
    skeleton = ctx.skeleton
    missing = skeleton.missing_header
    if skeleton.generation_prompt != "" or missing is None:
        return []  # it writes a header, or the prompt already ends where a reply starts (Mistral's [/INST])
    return [
        Problem(
            f"{template_file(ctx)}: add_generation_prompt=True changes nothing in the render, so a serving prompt "
            f"ends after the user's turn, without the {missing!r} that training puts before each reply: the model "
            "continues the user's text instead of answering",
            "end the template with {% if add_generation_prompt %}{{ " + repr(missing) + " }}{% endif %}",
            template_file(ctx),
        )
    ]


def check_prefix_stable(ctx: Context) -> list[Problem]:
    """``prefix-unstable``: the template rewrites history, so one example per conversation trains unseen prompts."""
    messages = [dict(m) for m in ctx.skeleton.messages]
    first_reply = next(m for m in messages if m["role"] == "assistant" and m["content"] == ASSISTANT_1)
    first_reply["reasoning_content"] = "Probe reasoning."
    try:
        report = ctx.fmt.check_prefix_stable(messages)
    except TemplateError as exc:
        raise NotEvaluated(f"the template refuses the probe with reasoning: {exc}") from None
    if report:
        return []
    turn = next(t for t in report.turns if not t.stable)
    what = "the serving prompt" if not turn.prompt_stable else "the reply as generated"
    return [
        Problem(
            f"{template_file(ctx)} rewrites history: for the reply after {USER_1!r}, {what} is not a prefix of the "
            f"whole conversation's render (character {turn.offset}: {turn.expected_excerpt!r} vs "
            f"{turn.render_excerpt!r}), so one example per conversation trains that reply in a context never seen "
            "at serving",
            "train one example per assistant turn: `turnkit prepare --split-turns` or fmt.encode(..., "
            "split_turns=True)",
            template_file(ctx),
        )
    ]


def check_history_rewrite(ctx: Context) -> list[Problem]:
    """``history-rewrite``: in an agent episode, the template's render at turn N+1 does not begin with what the
    engine was given and sampled at turn N (earlier reasoning dropped, a reply written another way once later
    messages follow), so token-in token-out RL must choose up front what a trajectory does there
    (:mod:`turnkit.trajectory`: the same probe episodes a trajectory runs on creation)."""
    from turnkit.trajectory import rewrites_history

    fmt = ctx.fmt
    tools = [PROBE_TOOL]

    def render(chat: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return fmt.render(chat, tools=tools, add_generation_prompt=add_generation_prompt)

    def encode(chat: list[dict[str, Any]]) -> list[int]:
        # A marker the tokenizer lacks warns here as in any encode, once per encoder: silencing it here would
        # silence it for the whole audit (the encoder records the marker as reported).
        encoding = fmt.encode(chat, tools=tools, add_generation_prompt=True, turns="none", attribution=False)
        return encoding.input_ids.tolist()  # type: ignore[union-attr]

    call_id = fmt.replies.call_ids.maker()  # the ids the template accepts (Mistral's check theirs)
    try:
        fmt.tokenizer  # noqa: B018 - the ids are checked where there is a tokenizer, the text alone elsewhere
    except TurnkitError:
        reason = rewrites_history(render, tools=tools, eos=fmt.eos_token, call_id=call_id)
    else:
        reason = rewrites_history(render, encode=encode, tools=tools, eos=fmt.eos_token, call_id=call_id)
    if not reason:
        return []
    return [
        Problem(
            f"{template_file(ctx)} rewrites history in an agent episode ({reason}): the ids a trainer gets by "
            "appending each sampled reply and the next messages are not the template's own render of the episode",
            'choose the policy up front: fmt.trajectory(..., history="keep") trains what the engine saw, "fork" '
            'starts a new row from the template\'s render where it rewrites, "refuse" raises naming the turn',
            template_file(ctx),
        )
    ]


_TOOL_PROBE = [{"role": "user", "content": USER_1}]


def check_tools_ignored(ctx: Context) -> list[Problem]:
    """``tools-ignored``: the template renders the same serving prompt with and without tools, so a model served with
    it never sees them (servers that take the tools anyway answer as if there were none)."""
    fmt = ctx.fmt
    try:
        shown = fmt.render(_TOOL_PROBE, tools=[PROBE_TOOL], add_generation_prompt=True)
        bare = fmt.render(_TOOL_PROBE, add_generation_prompt=True)
    except TemplateError as exc:
        raise NotEvaluated(f"the template refuses the tool probe: {exc}") from None
    if shown != bare:
        return []
    return [
        Problem(
            "the template renders the same prompt with and without tools: a model served with it never sees them, "
            "and a server that accepts them anyway returns replies written as if there were none",
            "serve tools with a template that shows them (turnkit serve answers requests with tools with a 400 "
            "here); a chat-only model needs nothing",
            template_file(ctx),
        )
    ]


def check_tools_unreadable(ctx: Context) -> list[Problem]:
    """``tools-unreadable``: the template writes tool calls in a syntax that no reading gives back: served, the
    model's calls would come back as text."""
    choice = ctx.fmt.reply_choice
    if not choice.tools_unreadable:
        return []
    return [
        Problem(
            "the template writes tool calls in a syntax turnkit cannot read back, so a served model's calls would come "
            f"back as text (turnkit serve answers requests with tools with a 400): {choice.format.reason}",
            "write tool calls in a syntax the template's own renders show unambiguously (a marker before each call "
            "and each argument), or name a reply format when parsing (reply_format=...)",
            template_file(ctx),
        )
    ]
