"""Whole numbers read from the command line, as every turnkit flag reads them: one wording for every count that
fails, shared by the commands (:mod:`turnkit.cli.common`) and the engine-option table below them
(:mod:`turnkit.serve.engines.options`), which declares its flags' value kinds itself."""

from __future__ import annotations

import argparse

__all__ = ["positive_int", "whole_number"]


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of tokens, workers, records)."""
    return whole_number(text, least=1)


def whole_number(text: str, *, least: int, unit: str = "") -> int:
    """A whole number of at least ``least`` (argparse's type error otherwise, naming ``unit`` where given)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number{unit and ' of ' + unit}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}{unit and ' ' + unit}, not {value}")
    return value
