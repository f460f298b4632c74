"""``@huggingface/jinja`` (JavaScript: transformers.js and the apps built on it), run by node in a child process.

The package is pinned (:data:`VERSION`) and installed from npm into turnkit's cache folder, once, by
:func:`install` (``python -m turnkit.doctor.runtimes setup``, which ``./dev.sh test`` runs), as the tests install the
agent CLIs. ``hfjs_render.mjs`` is the whole program: ``new Template(text).render(context)``, nothing added, which is
what transformers.js's ``apply_chat_template`` does with the same variables.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from turnkit.cache import cache_dir
from turnkit.doctor.runtimes.child import ChildRenderer

__all__ = ["VERSION", "HfJinjaRenderer", "install"]

#: The pinned ``@huggingface/jinja`` release.
VERSION = "0.5.13"
PACKAGE = "@huggingface/jinja"
SCRIPT = Path(__file__).with_name("hfjs_render.mjs")


def folder() -> Path:
    """Where the pinned package is installed (an npm prefix)."""
    return cache_dir() / "runtimes" / f"hfjs-{VERSION}"


def entry() -> Path:
    return folder() / "node_modules" / "@huggingface" / "jinja" / "dist" / "index.js"


def install() -> Path:
    """Install the pinned package with npm into the cache folder (nothing when it is there); its entry file."""
    if entry().is_file():
        return entry()
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(f"npm is not on PATH: {PACKAGE} cannot be installed (node 18 or later, and npm)")
    folder().mkdir(parents=True, exist_ok=True)
    quiet = ["--no-audit", "--no-fund", "--ignore-scripts"]
    done = subprocess.run(
        [npm, "install", "--prefix", str(folder()), *quiet, f"{PACKAGE}@{VERSION}"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0 or not entry().is_file():
        raise RuntimeError(f"npm install {PACKAGE}@{VERSION} failed: {done.stderr.strip()[-500:]}")
    return entry()


class HfJinjaRenderer(ChildRenderer):
    """``@huggingface/jinja`` in one long-lived node process."""

    name = "hf-jinja"
    served_by = "transformers.js and apps built on @huggingface/jinja"

    def missing(self) -> str | None:
        if shutil.which("node") is None:
            return "node is not on PATH"
        if not entry().is_file():
            return f"{PACKAGE}@{VERSION} is not installed (python -m turnkit.doctor.runtimes setup)"
        return None

    def version(self) -> str:
        try:
            installed = json.loads((entry().parents[1] / "package.json").read_text(encoding="utf-8"))["version"]
        except (OSError, ValueError, KeyError):
            installed = f"{VERSION} (not installed)"
        return f"{PACKAGE} {installed}"

    def command(self) -> list[str]:
        return [shutil.which("node") or "node", str(SCRIPT), str(entry())]
