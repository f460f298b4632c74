"""The shapes of the tool-call ids a reader makes for calls written without one (which shape a template gets is
decided once, by rendering: :mod:`turnkit.parse.choice.call_ids`).

Each shape has two makers: a random one, unique per reply, for ids that leave the process (the server's replies, a
trajectory's), and a numbered one whose id follows from the call's index alone, for a reading shown to a person
(``turnkit parse``: the same reply gives the same ids on every run, whole or streamed)."""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from typing import Literal

__all__ = ["NUMBERED", "SHAPES", "Shape", "default_call_id", "nine_call_id"]

Shape = Literal["call", "nine"]
_ALPHANUMERIC = string.ascii_letters + string.digits


def default_call_id() -> Callable[[int], str]:
    """OpenAI's shape, unique per reply: ``call_`` + 12 random hex digits + the call's index."""
    prefix = secrets.token_hex(6)
    return lambda index: f"call_{prefix}{index}"


def nine_call_id() -> Callable[[int], str]:
    """Mistral's shape (its templates raise on any other): nine random letters and digits per call."""
    return lambda index: "".join(secrets.choice(_ALPHANUMERIC) for _ in range(9))


#: Each shape's maker: called once per reply, it gives the reply's id maker (call index -> id).
SHAPES: dict[Shape, Callable[[], Callable[[int], str]]] = {"call": default_call_id, "nine": nine_call_id}


def _numbered_call(index: int) -> str:
    return f"call_{index}"


def _numbered_nine(index: int) -> str:
    """Nine letters and digits, as Mistral's templates require: ``call00000``, ``call00001`` ..."""
    return f"call{index:05d}"


#: Each shape's numbered maker (call index -> id), the same id for the same index every time.
NUMBERED: dict[Shape, Callable[[int], str]] = {"call": _numbered_call, "nine": _numbered_nine}
