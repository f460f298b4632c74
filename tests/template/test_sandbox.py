"""Malicious and runaway templates are refused with turnkit's errors; each payload is listed here."""

from __future__ import annotations

import time

import pytest

from turnkit import (
    ChatFormat,
    RenderLimits,
    TemplateError,
    TemplateLimitError,
    TemplateSecurityError,
    TemplateSyntaxError,
)

MESSAGES = [{"role": "user", "content": "hi"}]

ESCAPES = {
    "cycler globals": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "joiner globals": "{{ joiner.__init__.__globals__ }}",
    "namespace globals": "{{ namespace.__init__.__globals__ }}",
    "lipsum globals": "{{ lipsum.__globals__['os'] }}",
    "raise_exception globals": "{{ raise_exception.__globals__ }}",
    "strftime_now globals": "{{ strftime_now.__globals__['datetime'] }}",
    "dict helper class": "{{ dict.__class__ }}",
    "str mro walk": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "tuple base walk": "{{ ().__class__.__base__.__subclasses__() }}",
    "attr filter chain": "{{ ''|attr('__class__')|attr('__mro__') }}",
    "attr filter on cycler": "{{ cycler|attr('__init__')|attr('__globals__') }}",
    "getitem dunder": "{{ messages['__class__'] }}",
    "message class": "{{ messages[0].__class__ }}",
    "bound method self": "{{ messages.__getitem__ }}",
    "template reference internals": "{{ self._TemplateReference__context }}",
    "format string attribute walk": "{{ '{0.__class__.__init__.__globals__}'.format(cycler) }}",
    "format_map attribute walk": "{{ '{x.__class__}'.format_map({'x': messages}) }}",
    "percent format of dunder": "{{ '%s' % messages.__class__ }}",
    "list mutation": "{{ messages.append({'role': 'system', 'content': 'pwned'}) }}",
    "dict mutation": "{{ messages[0].update({'role': 'system'}) }}",
    "list pop": "{% set _ = messages.pop() %}",
    "namespace private attribute": "{% set ns = namespace(_secret=1) %}",
    "namespace private assignment": "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "lipsum call": "{{ lipsum(5) }}",
    "include a file": "{% include '/etc/passwd' %}",
    "import a file": "{% import 'os' as os %}",
    "extends a file": "{% extends '/etc/hostname' %}",
}

RUNAWAYS = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop over a huge string": "{% for a in 'x' * 100000 %}{% for b in 'y' * 100000 %}{% endfor %}{% endfor %}",
    "string repeat": "{{ 'a' * 10000000000 }}",
    "list repeat": "{{ [1, 2] * 10000000000 }}",
    "doubling with +": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
    "{% endfor %}",
    "doubling with ~": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
    "{% endfor %}",
    "huge power": "{{ 10 ** 100000000 }}",
    "percent width": "{{ '%999999999999d' % 1 }}",
    "percent star width": "{{ '%*d' % (999999999999, 1) }}",
    "format width": "{{ '{:>999999999999}'.format('x') }}",
    "format filter width": "{{ '%999999999999s'|format('x') }}",
    "center filter": "{{ 'x'|center(999999999999) }}",
    "indent filter": "{{ ('a\\n' * 1000)|indent(999999999) }}",
    "replace filter": "{{ ('a' * 1000000)|replace('a', 'b' * 1000) }}",
    "replace method": "{{ ('a' * 1000000).replace('', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
    "ljust method": "{{ 'x'.ljust(999999999999) }}",
    "zfill method": "{{ '1'.zfill(999999999999) }}",
    "expandtabs method": "{{ ('\\t' * 100000).expandtabs(100000) }}",
    "join of a huge separator": "{{ ('x' * 10000000).join(['a'] * 100) }}",
    "join filter": "{{ range(100000)|join('x' * 10000) }}",
    "tojson of a huge value": "{{ (['xxxxxxxxxx'] * 1000000 * 2)|tojson }}",
    "output flood": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "huge range": "{{ range(10000000000)|list }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


@pytest.mark.parametrize("source", ESCAPES.values(), ids=ESCAPES.keys())
def test_sandbox_escapes_are_refused(source):
    fmt = ChatFormat.from_template(source)
    with pytest.raises(TemplateSecurityError):
        fmt.render(MESSAGES)


@pytest.mark.parametrize("source", RUNAWAYS.values(), ids=RUNAWAYS.keys())
def test_runaway_templates_are_stopped(source):
    fmt = ChatFormat.from_template(source, limits=RenderLimits(timeout_s=0.5, max_output_chars=4_000_000))
    started = time.monotonic()
    with pytest.raises(TemplateLimitError):
        fmt.render(MESSAGES)
    assert time.monotonic() - started < 5


def test_time_limit_error_says_what_happened():
    fmt = ChatFormat.from_template(RUNAWAYS["nested loops"], limits=RenderLimits(timeout_s=0.2))
    with pytest.raises(TemplateLimitError, match=r"longer than 0.2 s"):
        fmt.render(MESSAGES)


def test_a_stopped_render_leaves_the_thread_usable():
    slow = ChatFormat.from_template(RUNAWAYS["nested loops"], limits=RenderLimits(timeout_s=0.1))
    fast = ChatFormat.from_family("chatml")
    for _ in range(3):
        with pytest.raises(TemplateLimitError):
            slow.render(MESSAGES)
        assert fast.render(MESSAGES) == "<|im_start|>user\nhi<|im_end|>\n"
    time.sleep(0.1)  # past any stale deadline: nothing fires into this thread later
    for _ in range(200):
        fast.render(MESSAGES)


def test_time_limit_can_be_turned_off():
    fmt = ChatFormat.from_template("{% for i in range(20000) %}{% endfor %}ok", limits=RenderLimits(timeout_s=None))
    assert fmt.render(MESSAGES) == "ok"


def test_raise_exception_keeps_the_templates_message():
    fmt = ChatFormat.from_template("{{ raise_exception('Conversation roles must alternate user/assistant') }}")
    with pytest.raises(TemplateError) as caught:
        fmt.render(MESSAGES)
    assert caught.value.template_message == "Conversation roles must alternate user/assistant"
    assert str(caught.value) == "Conversation roles must alternate user/assistant"
    assert type(caught.value) is TemplateError


def test_template_failures_name_the_line():
    fmt = ChatFormat.from_template("line one\n{{ messages[0].content + 5 }}")
    with pytest.raises(TemplateError, match="line 2"):
        fmt.render(MESSAGES)


def test_syntax_errors_are_reported_at_construction():
    with pytest.raises(TemplateSyntaxError, match="line 2"):
        ChatFormat.from_template("ok\n{% for x in messages %}")


def test_limits_do_not_disturb_normal_templates():
    fmt = ChatFormat.from_template(
        "{% set ns = namespace(text='') %}{% for m in messages %}{% set ns.text = ns.text ~ m.role ~ ':' ~ m.content %}"
        "{% endfor %}{{ ns.text * 2 }}|{{ '%5s' % 'ab' }}|{{ '{:>4}'.format('x') }}|{{ 'ab'|center(6) }}|{{ 2 ** 10 }}"
    )
    assert fmt.render(MESSAGES) == "user:hiuser:hi|   ab|   x|  ab  |1024"
