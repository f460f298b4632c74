"""Spliced renders equal the template's own renders: every corpus template, every conversation, texts that templates
branch on (reasoning tags, padding, JSON, markers' neighbours), one string changed or all of them.

The renderer checks its first uses against a direct render itself and warns on a difference; here that warning is an
error, and every render is also compared by the test (the renderer stops checking after two uses of a skeleton).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any

import pytest
from conversations import conversations
from corpus import Case, all_templates

from turnkit.errors import SpliceMismatchWarning, TemplateLimitError, TurnkitError
from turnkit.messages import normalize_conversation, plain_data
from turnkit.template.render import RenderLimits, render_prepared
from turnkit.template.splice import SplicingRenderer
from turnkit.template.taint import SOURCE_TOOLS, DataStr
from turnkit.template.tools import tool_schemas

TEMPLATES = all_templates()
LIMITS = RenderLimits()
PATIENT = RenderLimits(timeout_s=10 * (LIMITS.timeout_s or 2.0))

#: Texts put in place of every string of a conversation (the shape stays: no string becomes empty).
VARIANTS = [
    lambda text: text + " (and more)",
    lambda text: "<think>\nweighing it\n</think>\n\n" + text,
    lambda text: "  \n" + text + " \t\n",
    lambda text: '{"city": "Oslo", "n": [1, 2]}',
    lambda text: "x",
    lambda text: text.upper() + "\n\nQ: next?",
]


def _tag(value: Any, source: int) -> Any:
    """Data as the encoder hands it to a render: every non-empty string tagged with where it came from."""
    if isinstance(value, str):
        if not value:
            return value
        out = DataStr(value)
        out._spans = ((0, len(value), source),)
        return out
    if isinstance(value, dict):
        return {k: (v if k == "role" else _tag(v, source)) for k, v in value.items()}
    if isinstance(value, list):
        return [_tag(v, source) for v in value]
    return value


def _rewrite(value: Any, change, only: int | None, at: list[int]) -> Any:
    """``value`` with its strings (not roles, not keys) changed by ``change``; only string number ``only`` if given."""
    if isinstance(value, str):
        if not value:
            return value
        index = at[0]
        at[0] += 1
        return change(value) if only is None or index == only else value
    if isinstance(value, dict):
        return {k: (v if k == "role" else _rewrite(v, change, only, at)) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite(v, change, only, at) for v in value]
    return value


def _context(messages, tools, add_generation_prompt: bool, variables: dict[str, Any]) -> dict[str, Any]:
    chat = normalize_conversation(messages)
    return {
        "messages": [_tag(m, index) for index, m in enumerate(chat)],
        "tools": _tag(plain_data(tool_schemas(tools)), SOURCE_TOOLS),
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        **variables,
    }


def _outcome(render, source: str, context: dict[str, Any], track: bool) -> Any:
    """The render, or the error it raised. The time limit is not what is compared here: a render stopped by it (a
    machine busy with other work can make a slow template overrun 2 s) is tried once more with ten times as long."""
    for limits in (LIMITS, PATIENT):
        try:
            out = render(source, context, limits=limits, track_generation=track)
        except TemplateLimitError as exc:
            if limits is PATIENT or "ran longer" not in str(exc):
                return ("raised", type(exc).__name__, str(exc))
        except TurnkitError as exc:
            return ("raised", type(exc).__name__, str(exc))
        else:
            return (out.text, out.generation_spans, out.data_spans)
    raise AssertionError("unreachable")


def _cases(template) -> list[Case]:
    own = [Case(f"own {c.name}", c.messages, c.tools, c.add_generation_prompt, c.variables) for c in template.own_cases]
    standard = [Case(name, messages, tools, gen) for name, messages, tools in conversations() for gen in (False, True)]
    return [*standard, *own]


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_spliced_renders_equal_direct_renders(template):
    source = template.source
    track = "generation" in source
    renderer = SplicingRenderer()
    compared = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpliceMismatchWarning)
        for case in _cases(template):
            variables = {**template.special_tokens, **case.variables}
            strings = [0]
            _rewrite(case.messages, str, None, strings)
            inputs = [case.messages]
            inputs += [_rewrite(case.messages, change, None, [0]) for change in VARIANTS]
            inputs += [_rewrite(case.messages, VARIANTS[1], only, [0]) for only in range(min(strings[0], 6))]
            for messages in inputs:
                try:
                    context = _context(messages, case.tools, case.add_generation_prompt, variables)
                except TurnkitError:
                    continue  # refused before any render (both ways)
                expected = _outcome(render_prepared, source, context, track)
                got = _outcome(renderer.render, source, context, track)
                assert got == expected, f"{case.name}: spliced render differs"
                compared += 1
    assert renderer.enabled
    spliced = sum(shape.hits for shape in renderer._shapes.values())
    assert compared
    # most templates only output text: their renders must actually be spliced, not all rendered directly
    if not any(shape.direct for shape in renderer._shapes.values()):
        assert spliced, "no render was spliced"


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _chat(*texts: str) -> list[dict[str, str]]:
    roles = ["system", "user", "assistant", "user"]
    return [{"role": roles[n % 4], "content": text} for n, text in enumerate(texts)]


def test_one_shape_is_traced_once_and_filled_after():
    renderer = SplicingRenderer()
    for n in range(20):
        context = _context(_chat("Be brief.", f"question {n} " * n + "?", f"answer {n}"), None, False, {})
        assert renderer.render(CHATML, context, limits=LIMITS, track_generation=False) == render_prepared(
            CHATML, context, limits=LIMITS
        )
    (shape,) = renderer._shapes.values()
    assert (shape.misses, shape.hits, shape.observed, shape.direct) == (1, 19, (), False)


def test_strings_the_template_reads_are_part_of_the_key():
    source = "{% for m in messages %}{% if m.content.startswith('!') %}LOUD {% endif %}{{ m.content }}|{% endfor %}"
    renderer = SplicingRenderer()
    for texts in [("!a", "b"), ("c", "d"), ("!a", "e"), ("c", "!f")]:
        context = _context(_chat(*texts), None, False, {})
        spliced = renderer.render(source, context, limits=LIMITS, track_generation=False)
        assert spliced == render_prepared(source, context, limits=LIMITS)
    (shape,) = renderer._shapes.values()
    assert shape.observed == (0, 1)  # both strings are read: every different pair is its own skeleton


def test_a_size_limit_the_real_text_would_hit_is_not_spliced_past():
    source = (
        "{% set ns = namespace(s='') %}{% for i in range(50) %}{% set ns.s = ns.s ~ messages[0].content %}"
        "{% endfor %}{{ messages[0].content }}"
    )
    limits = RenderLimits(max_output_chars=70_000)
    renderer = SplicingRenderer()
    small = _context(_chat("tiny"), None, False, {})
    assert renderer.render(source, small, limits=limits, track_generation=False).text == "tiny"
    big = _context(_chat("x" * 2_000), None, False, {})  # 50 copies: 100,000 characters built, over the limit
    with pytest.raises(TurnkitError, match="70,000"):
        render_prepared(source, big, limits=limits)
    with pytest.raises(TurnkitError, match="70,000"):
        renderer.render(source, big, limits=limits, track_generation=False)


def test_a_wrong_skeleton_is_caught_and_splicing_turns_off():
    renderer = SplicingRenderer()
    context = _context(_chat("Be brief.", "hi"), None, False, {})
    renderer.render(CHATML, context, limits=LIMITS, track_generation=False)
    (shape,) = renderer._shapes.values()
    entry = next(iter(shape.skeletons.values()))
    entry[0] = replace(entry[0], literals=("broken", *entry[0].literals[1:]))
    with pytest.warns(SpliceMismatchWarning):
        out = renderer.render(CHATML, context, limits=LIMITS, track_generation=False)
    assert out == render_prepared(CHATML, context, limits=LIMITS)
    assert not renderer.enabled


def test_trimmed_text_is_spliced_and_whitespace_only_text_is_rendered_directly():
    source = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}{% if m.content.rstrip() %}.{% endif %}"
        "<|end|>{% endfor %}"
    )
    renderer = SplicingRenderer()
    for texts in [("  Be brief. ", "hi\n"), ("x", "\n\n  long question \t"), ("Be brief.", "   ")]:
        context = _context(_chat(*texts), None, False, {})
        spliced = renderer.render(source, context, limits=LIMITS, track_generation=False)
        assert spliced == render_prepared(source, context, limits=LIMITS)
    (shape,) = renderer._shapes.values()
    assert shape.observed == () and shape.hits == 2  # the third: "   " trims to "", rendered directly


def _call(arguments: dict[str, Any]) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    return [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "", "tool_calls": [call]}]


def test_arguments_written_with_tojson_are_holes_filled_with_their_escaped_text():
    """Qwen's and Hermes' templates write tool-call arguments with ``tojson``: the JSON text depends on the strings
    only through their escaping (ensure_ascii off), so one skeleton serves every city, quotes and control characters
    included; with ``ensure_ascii`` the strings are read (part of the key), as any filter's arguments."""
    source = (
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% for c in m.tool_calls or [] %}"
        "{{ c.function.arguments | tojson }}{{ c.function.arguments.city | tojson(sort_keys=true) }}{% endfor %}"
        "<|end|>{% endfor %}"
    )
    cities = ["Oslo", 'Say "hi"\\', "Zürich\n\t\x01", "東京 🙂", "a\u2028b"]
    for ascii_source in (source, source.replace("| tojson }}", "| tojson(ensure_ascii=true) }}", 1)):
        renderer = SplicingRenderer()
        for city in cities:
            context = _context(_call({"city": city, "days": 3}), None, False, {})
            spliced = renderer.render(ascii_source, context, limits=LIMITS, track_generation=False)
            assert spliced == render_prepared(ascii_source, context, limits=LIMITS)
        (shape,) = renderer._shapes.values()
        if ascii_source is source:
            assert (shape.observed, shape.misses, shape.hits) == ((), 1, len(cities) - 1)
        else:
            assert shape.observed  # ensure_ascii writes other characters as escapes: the text is read


def test_a_render_that_writes_the_date_is_reused_only_while_the_date_holds(monkeypatch):
    import turnkit.template.splice as splice

    source = "Today: {{ strftime_now('%Y-%m-%d') }}\n{% for m in messages %}{{ m.content }}\n{% endfor %}"
    renderer = SplicingRenderer()
    context = _context(_chat("a", "b"), None, False, {})
    first = renderer.render(source, context, limits=LIMITS, track_generation=False)
    (shape,) = renderer._shapes.values()
    (entry,) = shape.skeletons.values()
    assert entry[0].clock and entry[0].current()

    class Tomorrow:
        @staticmethod
        def now():
            from datetime import datetime, timedelta

            return datetime.now() + timedelta(days=1)

    monkeypatch.setattr(splice, "datetime", Tomorrow)
    assert not entry[0].current()
    renderer.render(source, context, limits=LIMITS, track_generation=False)
    assert shape.misses == 2  # traced again
    assert first.text.startswith("Today: ")
