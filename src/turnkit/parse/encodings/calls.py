"""The one rule for a tool call's arguments text.

Every call turnkit returns has arguments that are JSON text (what OpenAI clients ``json.loads``), whatever the model
wrote: an object is passed as written; a JSON *string* that holds a serialized object (a model that serialized its
arguments itself, as Granite does) is that object's text rather than being encoded twice; any other JSON string
stays a JSON string (``"hello"`` gives the arguments text ``"\\"hello\\""``, as vLLM does), never bare text that is
not JSON. The machine applies it to every encoding whose arguments are JSON text.
"""

from __future__ import annotations

import json

#: The characters of a function name (a hole read as a name that holds another is no name).
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/@")

__all__ = ["NAME_CHARS", "arguments_text"]


def arguments_text(raw: str) -> tuple[str, str | None]:
    """The arguments text for the raw JSON text of an arguments value, and an error when it is not valid JSON."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return raw, f"the arguments are not valid JSON ({exc})"
    if isinstance(value, str):
        try:
            serialized = json.loads(value)
        except ValueError:
            return raw, None
        return (value if isinstance(serialized, dict) else raw), None
    return raw, None
