"""The plugin's flags as one set, checked on vLLM's command line before anything is loaded.

turnkit's parsers read replies by the format of the checkpoint's own template, and only turnkit's renderer keeps a
marker a user types as text. A parser flag added to a command line without the tokenizer mode would read replies the
turnkit way while vLLM renders prompts its own way, where ``<|im_end|>\\n<|im_start|>system`` in a message becomes a
real system turn: a server that looks protected and is not. So the flags are one set, and a start with part of it
stops with one line naming what is missing, before vLLM reads the model (vLLM loads the plugin while it builds its
argument parser; the check reads ``sys.argv`` there, and the ``--config`` YAML file vLLM merges into it).

The sets that start:

* all four: ``--tokenizer-mode turnkit --enable-auto-tool-choice --tool-call-parser turnkit --reasoning-parser
  turnkit``: prompts encoded and replies read by turnkit;
* ``--tokenizer-mode turnkit`` alone, with no tool or reasoning parser at all: prompts encoded by turnkit, replies
  returned as text.

Anything else naming turnkit stops: a parser without the tokenizer mode, one of the two parsers without the other
(turnkit reads reasoning and calls in one pass), the tool parser without ``--enable-auto-tool-choice``, another
family's parser beside the tokenizer mode (it would read replies by a format the template may not write), and a
server-wide ``--chat-template`` (the replies are read by the checkpoint's own template; every chat would be a 400).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PluginFlags", "flag_problem", "read_flags"]

MODE = "turnkit"

#: The plugin's whole set, as the guide writes it.
WHOLE_SET = f"--tokenizer-mode {MODE} --enable-auto-tool-choice --tool-call-parser {MODE} --reasoning-parser {MODE}"


@dataclass(frozen=True)
class PluginFlags:
    """What a vLLM command line sets of the flags the plugin cares about (None: not given)."""

    tokenizer_mode: str | None = None
    tool_call_parser: str | None = None
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    chat_template: str | None = None

    @property
    def asks_for_turnkit(self) -> bool:
        return MODE in (self.tokenizer_mode, self.tool_call_parser, self.reasoning_parser)


_VALUED = ("tokenizer_mode", "tool_call_parser", "reasoning_parser", "chat_template")


def read_flags(argv: Sequence[str]) -> PluginFlags:
    """The plugin's flags in ``argv`` as vLLM reads them: ``--flag value`` or ``--flag=value``, ``_`` or ``-`` in the
    name, the last one winning, over the keys of a ``--config`` YAML file (vLLM's own merge order)."""
    found: dict[str, Any] = {}
    config: str | None = None
    args = list(argv)
    for n, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if not sep:
            value = args[n + 1] if n + 1 < len(args) and not args[n + 1].startswith("--") else ""
        if name == "config":
            config = value
        elif name in _VALUED:
            found[name] = value
        elif name == "enable_auto_tool_choice":
            found[name] = True
        elif name == "no_enable_auto_tool_choice":
            found["enable_auto_tool_choice"] = False
    settings = {**_config_file(config), **found}
    return PluginFlags(
        **{key: (str(settings[key]) if settings.get(key) is not None else None) for key in _VALUED},
        enable_auto_tool_choice=bool(settings.get("enable_auto_tool_choice", False)),
    )


def _config_file(path: str | None) -> dict[str, Any]:
    """The plugin's keys of vLLM's ``--config`` YAML file (unreadable: none; vLLM reports it itself)."""
    if not path:
        return {}
    try:
        import yaml
    except ImportError:
        return {}
    try:
        loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):  # vLLM reports a file it cannot read itself
        return {}
    if not isinstance(loaded, dict):
        return {}
    keys = {*_VALUED, "enable_auto_tool_choice"}
    return {str(k).replace("-", "_"): v for k, v in loaded.items() if str(k).replace("-", "_") in keys}


def flag_problem(flags: PluginFlags) -> str | None:
    """The one line that stops a start with part of the plugin's flags, or None for a set that starts (the module's
    docstring lists them)."""
    if not flags.asks_for_turnkit:
        return None
    tool, reasoning = flags.tool_call_parser, flags.reasoning_parser
    if flags.tokenizer_mode != MODE:
        given = f"--tool-call-parser {MODE}" if tool == MODE else f"--reasoning-parser {MODE}"
        mode = f"--tokenizer-mode {flags.tokenizer_mode}" if flags.tokenizer_mode else "vLLM's own tokenizer mode"
        return _line(
            f"{given} with {mode} reads replies the turnkit way while vLLM renders prompts its own way, where a "
            f"message that types <|im_start|>system becomes a real system turn: add --tokenizer-mode {MODE}"
        )
    if flags.chat_template is not None:
        return _line(
            f"--chat-template with --tokenizer-mode {MODE}: prompts are encoded and replies read by the checkpoint's "
            "own template, so every chat would be refused; put the template into the model folder as "
            "chat_template.jinja and drop --chat-template"
        )
    if tool is None and reasoning is None:
        return None
    for flag, value in (("--tool-call-parser", tool), ("--reasoning-parser", reasoning)):
        if value is None:
            return _line(
                f"turnkit reads tool calls and reasoning in one pass, so its parsers go together: add {flag} {MODE}"
            )
        if value != MODE:
            return _line(
                f"{flag} {value} beside --tokenizer-mode {MODE}: replies are read by the format of the checkpoint's "
                f"template, not a family's parser: give {flag} {MODE}"
            )
    if not flags.enable_auto_tool_choice:
        return _line(
            f"--tool-call-parser {MODE} reads the model's own calls only with --enable-auto-tool-choice: add it"
        )
    return None


def _line(reason: str) -> str:
    return f"turnkit: error: {reason} (the plugin's flags: {WHOLE_SET}; or --tokenizer-mode {MODE} alone)"
