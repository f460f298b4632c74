"""The corpus table of docs/guides/other-runtimes.md: every template of ../shared/conformance rendered in each other
Jinja runtime (llama.cpp's, minijinja's as mistral.rs sets it up, @huggingface/jinja's) on doctor's probe conversations,
against turnkit's reference render (transformers', byte for byte).

Usage: python benchmarks/runtimes.py [--sample N] [--runtimes llama.cpp,minijinja,hf-jinja] [--json OUT]

Prints, per runtime and with its version: templates identical / differs / fails (a template fails when the runtime
refuses one probe the reference renders, differs when a render is not byte-identical), the same counts over single
probe renders, and the most common causes with an example template each, as the Markdown the docs page holds.
``--sample N`` takes N templates spread evenly over the corpus (tests/doctor/test_doctor_runtimes.py runs a sample in
CI); the full run is by hand (``python -m turnkit.doctor.runtimes setup`` first). A template the reference cannot
compile or that refuses every probe is counted apart, as not compared.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import all_templates

from turnkit import ChatFormat
from turnkit.doctor.runtimes import renderers
from turnkit.doctor.runtimes.compare import DIFFERS, FAILS, IDENTICAL, compare
from turnkit.doctor.runtimes.probes import reference_renders
from turnkit.errors import TurnkitError


def _sample(templates: list[Any], count: int | None) -> list[Any]:
    if count is None or count >= len(templates):
        return templates
    step = len(templates) / count
    return [templates[int(i * step)] for i in range(count)]


def run(sample: int | None, runtimes: list[str] | None) -> dict[str, Any]:
    """The table's data: per runtime its version, template and probe counts, and causes with an example each."""
    templates = _sample(all_templates(), sample)
    chosen = renderers(runtimes)
    table: dict[str, Any] = {
        "templates": len(templates),
        "not_compared": {},
        "runtimes": {
            r.name: {
                "version": r.version(),
                "served_by": r.served_by,
                "missing": r.missing(),
                "templates": Counter(),
                "probes": Counter(),
                "causes": Counter(),
                "examples": {},
            }
            for r in chosen
        },
    }
    started = time.perf_counter()
    try:
        for template in templates:
            try:
                fmt = ChatFormat.from_template(template.source, **template.special_tokens)
                renders = reference_renders(fmt)
            except TurnkitError as exc:
                table["not_compared"][template.name] = f"the reference cannot compile it: {exc}"
                continue
            if all(r.text is None for r in renders):
                table["not_compared"][template.name] = "the reference refuses every probe"
                continue
            for renderer in chosen:
                row = table["runtimes"][renderer.name]
                if row["missing"]:
                    continue
                result = compare(renders, renderer)
                row["templates"][result.status] += 1
                row["probes"][IDENTICAL] += result.identical
                row["probes"][DIFFERS] += len(result.differences)
                row["probes"][FAILS] += len(result.failures)
                causes = {f"fails: {f.cause}" for f in result.failures} | {
                    f"differs: {d.cause}" for d in result.differences
                }
                for cause in causes:
                    row["causes"][cause] += 1
                    row["examples"].setdefault(cause, template.name)
    finally:
        for renderer in chosen:
            renderer.close()
    table["seconds"] = round(time.perf_counter() - started, 1)
    return table


def markdown(table: dict[str, Any], top: int = 8) -> str:
    """The table as the docs page shows it."""
    compared = table["templates"] - len(table["not_compared"])
    lines = [
        f"{table['templates']} templates, {compared} compared ({len(table['not_compared'])} the reference cannot "
        f"render at all); {table['seconds']} s.",
        "",
        "| runtime | version | templates identical | differs | fails | probe renders identical | differs | fails |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in table["runtimes"].items():
        if row["missing"]:
            lines.append(f"| {name} | not checked: {row['missing']} | | | | | | |")
            continue
        t, p = row["templates"], row["probes"]
        lines.append(
            f"| {name} | {row['version']} | {t[IDENTICAL]} | {t[DIFFERS]} | {t[FAILS]} | {p[IDENTICAL]} | "
            f"{p[DIFFERS]} | {p[FAILS]} |"
        )
    for name, row in table["runtimes"].items():
        if row["missing"] or not row["causes"]:
            continue
        lines += ["", f"Most common causes, {name} (templates; an example):", ""]
        for cause, count in row["causes"].most_common(top):
            shown = cause.replace("|", "\\|")
            lines.append(f"- {count}: `{shown}` ({row['examples'][cause]})")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, help="N templates spread over the corpus (default: all)")
    parser.add_argument("--runtimes", action="append", help="runtimes to run (default: all)")
    parser.add_argument("--engines", action="append", dest="runtimes", help=argparse.SUPPRESS)  # its old name
    parser.add_argument("--json", type=Path, help="also write the table's data as JSON here")
    args = parser.parse_args()
    table = run(args.sample, args.runtimes)
    sys.stdout.write(markdown(table))
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
