"""minijinja (Rust), set up as mistral.rs sets it up to render a checkpoint's chat template.

minijinja is the runtime of TGI, mistral.rs and Rust gateways; each server adds its own globals and filters, and what
they add decides whether a template renders. This module reproduces **mistral.rs**'s environment, from
``mistralrs-core/src/pipeline/chat_template.rs`` (EricLBuehler/mistral.rs at 0b4e96991a2df19de724d3ca39a33dedd20f10a6,
``apply_chat_template_to``), because it is the one that tries hardest to run Hugging Face templates unchanged:

* ``set_unknown_method_callback(pycompat)`` (Python methods such as ``.strip()``, ``.items()``): the Python binding's
  ``pycompat=True``;
* ``lstrip_blocks`` and ``trim_blocks`` on, as transformers sets them;
* the template text rewritten first: ``[::-1]`` to ``|reverse``, ``range(X, -1, -1)`` to ``range(X)|reverse``, GLM-4's
  ``{{ meta }}`` lines removed, SmolLM3's ``{% generation %}`` tags removed;
* ``raise_exception(msg)``: fails the render with ``msg``;
* ``strftime_now(fmt)``: the current UTC time (chrono's ``Utc::now().format``);
* ``tojson``: its own filter, not minijinja's: serde_json's compact output (``{"a":1}``, no spaces), or
  ``PrettyFormatter`` with ``indent=N``; non-ASCII kept; then ``<``, ``>``, ``&`` and ``'`` written as ``\\u003c``,
  ``\\u003e``, ``\\u0026``, ``\\u0027``. Its only keyword is ``indent``: minijinja refuses any other (``ensure_ascii``,
  ``sort_keys``: "unknown keyword argument"), as it does for every function that takes ``Kwargs``.

mistral.rs's request defaults (``enable_thinking`` true, ``reasoning_effort`` "medium", ``date_string``) are request
values, not the runtime's: here the template gets the same variables as the reference render, so a difference is the
runtime's. Its Gemma 4 message rewrite (tool results folded into the assistant turn) is a conversation rewrite, not a
render, and is left out.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import Any

from turnkit.doctor.runtimes.base import Renderer, RenderFailure

__all__ = ["MinijinjaRenderer", "mistralrs_template", "mistralrs_tojson"]

#: Instructions one render may take (minijinja's fuel): a runaway loop fails instead of hanging the check.
FUEL = 50_000_000
_DESCENDING_RANGE = re.compile(r"range\((?P<expr>[^,]+),\s*-1,\s*-1\)")
#: serde_json escapes these after serializing, so the output is safe in HTML too.
_HTML_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "'": "\\u0027"})


class _Raised(Exception):  # noqa: N818 - the template's own raise_exception, carried out of the runtime
    pass


def mistralrs_template(text: str) -> str:
    """The template text as mistral.rs rewrites it before compiling it."""
    text = _DESCENDING_RANGE.sub(lambda m: f"range({m['expr']})|reverse", text.replace("[::-1]", "|reverse"))
    if "{{ meta }}" in text:  # GLM-4
        text = text.replace('{%- set meta = message.get("metadata", "") %}', "").replace("{{ meta }}", "")
    if "{% generation %}" in text and "{% endgeneration %}" in text:  # SmolLM3
        text = text.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    return text


def mistralrs_tojson(value: Any, **kwargs: Any) -> str:
    """mistral.rs's ``tojson`` filter: serde_json's text, HTML-safe, with ``indent`` its only keyword."""
    indent = kwargs.pop("indent", None)
    if kwargs:
        raise TypeError(f"too many arguments: unknown keyword argument {next(iter(kwargs))!r}")
    if indent is not None:
        text = json.dumps(value, ensure_ascii=False, indent=int(indent), separators=(",", ": "))
    else:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text.translate(_HTML_SAFE)


def _raise_exception(message: Any) -> str:
    raise _Raised(str(message))


def _strftime_now(fmt: Any) -> str:
    return datetime.now(UTC).strftime(str(fmt))


class MinijinjaRenderer(Renderer):
    """minijinja through its Python binding (PyPI ``minijinja``, compiled Rust), as mistral.rs sets it up."""

    name = "minijinja"
    served_by = "mistral.rs; also TGI and Rust gateways, each with globals of its own"

    def missing(self) -> str | None:
        try:
            import minijinja  # noqa: F401
        except ImportError:
            return "the minijinja package is not installed (pip install minijinja)"
        return None

    def version(self) -> str:
        try:
            return f"minijinja {package_version('minijinja')}, as mistral.rs sets it up"
        except PackageNotFoundError:
            return "minijinja (not installed), as mistral.rs sets it up"

    def render(self, template: str, context: dict[str, Any]) -> str | RenderFailure:
        import minijinja

        env = minijinja.Environment(
            trim_blocks=True,
            lstrip_blocks=True,
            pycompat=True,
            fuel=FUEL,
            filters={"tojson": mistralrs_tojson},
            globals={"raise_exception": _raise_exception, "strftime_now": _strftime_now},
        )
        try:
            env.add_template("chat_template", mistralrs_template(template))
            return env.render_template("chat_template", **context)
        except _Raised as exc:
            return RenderFailure(f"raise_exception: {exc}")
        except minijinja.TemplateError as exc:
            return RenderFailure(_first_line(exc))
        except Exception as exc:  # noqa: BLE001 - a filter's error (tojson's keyword) comes out as itself
            return RenderFailure(str(exc))


def _first_line(exc: Exception) -> str:
    """minijinja's message without the source excerpt it appends (the report shows the line on its own)."""
    return str(exc).split("\n", 1)[0].strip()
