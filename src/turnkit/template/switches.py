"""A template's thinking switch: the variable it reads to turn reasoning on or off, or to set how much to reason.

Templates name their switch differently: Qwen3, GLM and DeepSeek R1 distills read ``enable_thinking``; DeepSeek V3.1
and Granite read ``thinking``; MiniMax reads ``thinking_mode`` (``"enabled"``, ``"disabled"``); gpt-oss reads
``reasoning_effort`` (``"low"``, ``"medium"``, ``"high"``) and Kimi ``thinking_effort``. A client asks in its API's
words (``reasoning_effort``, ``reasoning.effort``, Anthropic's ``thinking``, or the vLLM habit
``chat_template_kwargs: {"enable_thinking": false}``), so the server must find which variable *this* template reads
(:func:`thinking_switch`, from the template's own text, parsed and never run) and set that one. A request for a
switch the template does not have is an error rather than a variable the template never reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnkit.errors import SwitchError
from turnkit.template.sandbox import template_variables

__all__ = ["SWITCH_NAMES", "ThinkingSwitch", "thinking_switch"]

#: Variables that turn thinking on and off, most common first, with the values meaning on and off.
_TOGGLES: dict[str, tuple[Any, Any]] = {
    "enable_thinking": (True, False),
    "thinking": (True, False),
    "thinking_mode": ("enabled", "disabled"),
}
#: Variables that take a level of reasoning (a string the template checks itself).
_EFFORTS = ("reasoning_effort", "thinking_effort")

#: Every variable name known as a thinking switch: a template keyword argument of one of these names is a request
#: for the switch, translated to the template's own.
SWITCH_NAMES = frozenset(_TOGGLES) | frozenset(_EFFORTS)


@dataclass(frozen=True)
class ThinkingSwitch:
    """What a template reads to control reasoning: ``toggle`` turns it on and off, ``effort`` takes a level; either
    may be missing (both are for a template without a switch)."""

    toggle: str | None = None
    effort: str | None = None

    def __bool__(self) -> bool:
        return self.toggle is not None or self.effort is not None

    def to_dict(self) -> dict[str, Any]:
        return {"toggle": self.toggle, "effort": self.effort}

    def variables(self, enabled: bool | None = None, effort: str | None = None) -> dict[str, Any]:
        """The template variables for a request: ``enabled`` turns thinking on or off, ``effort`` sets a level (a
        level implies thinking on); ``None`` leaves the template's default.

        Raises:
            SwitchError: The template cannot do what was asked (no switch, or no way to turn thinking off).
        """
        out: dict[str, Any] = {}
        if enabled is None and effort is None:
            return out
        if not self:
            raise SwitchError("this model's chat template has no thinking switch (it reads none of " + _known() + ")")
        if enabled is False and self.toggle is None:
            raise SwitchError(f"this model's chat template cannot turn thinking off: it reads only {self.effort!r}")
        if self.toggle is not None:
            on, off = _TOGGLES[self.toggle]
            out[self.toggle] = off if enabled is False else on
        if effort is not None and enabled is not False:
            if self.effort is None and self.toggle is None:
                raise SwitchError("this model's chat template has no reasoning effort variable")
            if self.effort is not None:
                out[self.effort] = effort
        return out

    def translate(self, variables: dict[str, Any]) -> dict[str, Any]:
        """Template keyword arguments with any thinking switch renamed to the one this template reads
        (``enable_thinking=False`` becomes ``thinking=False`` for a template that reads ``thinking``).

        Raises:
            SwitchError: A switch is given that the template has no counterpart for.
        """
        out = {}
        for name, value in variables.items():
            if name not in SWITCH_NAMES or name in (self.toggle, self.effort):
                out[name] = value
            elif name in _TOGGLES and self.toggle is not None:
                on, off = _TOGGLES[self.toggle]
                was_on, _ = _TOGGLES[name]
                out[self.toggle] = on if value == was_on or value is True else off
            elif name in _EFFORTS and self.effort is not None:
                out[self.effort] = value
            else:
                have = ", ".join(repr(v) for v in (self.toggle, self.effort) if v) or "none"
                raise SwitchError(
                    f"this model's chat template does not read the thinking switch {name!r} (its switches: {have})"
                )
        return out


def _known() -> str:
    return ", ".join(sorted(SWITCH_NAMES))


def thinking_switch(source: str) -> ThinkingSwitch:
    """The thinking switch of a template's text: the first toggle and the first effort variable it reads.

    Raises :class:`~turnkit.TemplateSyntaxError` when the text is not valid Jinja."""
    read = template_variables(source)
    toggle = next((name for name in _TOGGLES if name in read), None)
    effort = next((name for name in _EFFORTS if name in read), None)
    return ThinkingSwitch(toggle, effort)
