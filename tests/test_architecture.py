"""The layering rule of docs/architecture.md, checked on the source: a module imports only from layers below its own.

Imports under ``if TYPE_CHECKING:`` are annotations only and do not count.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest
from repo_paths import REPO

SRC = REPO / "src" / "turnkit"

#: Layer of each top-level module or package of turnkit; lower layers never import higher ones.
LAYERS: dict[str, int] = {
    "errors": 0,
    "cache": 0,
    "quiet": 0,
    "collector": 0,
    "process_group": 0,
    "argtypes": 0,
    "messages": 1,
    "embedded": 1,
    "template": 2,
    "families": 2,
    "tokenizer": 3,
    "encode": 4,
    "parse": 4,
    "format": 5,
    "replies": 5,
    "trajectory": 5,
    "data": 6,
    "doctor": 6,
    "inspect": 6,
    "trainers": 6,
    "engine_client": 6,
    "serve": 7,
    "chatml": 7,
    "vllm_plugin": 7,
    "cli": 8,
    "__init__": 8,
}

#: Same-layer imports that are allowed (everything else within a layer is refused: encode and parse are siblings).
SIDEWAYS: set[tuple[str, str]] = {("format", "replies"), ("format", "trajectory")}


def _unit(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """Imported turnkit modules, skipping ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "turnkit":
            if node.module == "turnkit":
                found.extend((node.lineno, alias.name) for alias in node.names)
            else:
                found.append((node.lineno, node.module.split(".")[1]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name.split(".")[1]) for a in node.names if a.name.startswith("turnkit."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_only_go_down(path: Path) -> None:
    unit = _unit(path)
    assert unit in LAYERS, f"{unit} has no layer: add it to LAYERS here and to docs/architecture.md"
    for line, target in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
        if target == unit or target == "__version__":
            continue
        assert target in LAYERS, f"{path.name}:{line} imports turnkit.{target}, which has no layer"
        if (unit, target) in SIDEWAYS:
            continue
        assert LAYERS[target] < LAYERS[unit], (
            f"{path.relative_to(SRC)}:{line} imports turnkit.{target} (layer {LAYERS[target]}) from layer "
            f"{LAYERS[unit]}: only lower layers may be imported (docs/architecture.md)"
        )


def test_nothing_below_the_format_sees_it() -> None:
    """encode, parse, tokenizer and template get a typed ChatTemplate, never ChatFormat, not even for annotations."""
    for package in ("encode", "parse", "tokenizer", "template"):
        for path in (SRC / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = {alias.name for alias in node.names}
                    assert node.module != "turnkit.format" and "ChatFormat" not in names, f"{path}:{node.lineno}"


#: The server's rooms (src/turnkit/serve/__init__.py): what each may import of the rest of the server. A name not
#: listed imports freely within the server, except that nothing but the command line imports ``app``.
SERVE_ROOMS: dict[str, set[str]] = {
    "request_fields": set(),
    "engines": {"engines", "request_fields"},
    "protocol": {"request_fields"},
    "chat": {"protocol", "chunks", "session"},
    "completions": {"protocol", "chunks", "session"},
    "messages": {"protocol", "session"},
    "responses": {"protocol", "session"},
    "chunks": {"protocol", "session"},
}


def _serve_room(path: Path) -> str:
    return path.relative_to(SRC / "serve").with_suffix("").parts[0]


def _room_imports(tree: ast.Module, package: str) -> list[tuple[int, str]]:
    """The rooms of ``package`` (``serve``, ``parse``) a module imports at run time (``turnkit.<package>.X...`` and
    ``from turnkit.<package> import X``), skipping ``if TYPE_CHECKING:`` blocks."""
    prefix = f"turnkit.{package}"
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[:2] == prefix.split("."):
            parts = node.module.split(".")
            if len(parts) > 2:
                found.append((node.lineno, parts[2]))
            else:
                found.extend((node.lineno, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@pytest.mark.parametrize("path", sorted((SRC / "serve").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC / "serve")))
def test_serve_rooms(path: Path) -> None:
    """Engines need only their interface, the wire APIs are siblings over the shared protocol, and the HTTP app sits on
    top: only the command line imports it."""
    room = _serve_room(path)
    for line, target in _room_imports(ast.parse(path.read_text(encoding="utf-8")), "serve"):
        if target == room:
            continue
        assert target != "app", f"serve/{path.relative_to(SRC / 'serve')}:{line} imports serve.app (only the CLI may)"
        allowed = SERVE_ROOMS.get(room)
        assert allowed is None or target in allowed, (
            f"serve/{path.relative_to(SRC / 'serve')}:{line} imports serve.{target}; {room} may import only "
            f"{sorted(allowed) or 'nothing'} of the server (src/turnkit/serve/__init__.py)"
        )


#: The rooms of parse/ (src/turnkit/parse/__init__.py draws them): a room imports only rooms below it. Argument
#: encodings are below the formats that name them; reading runs formats; choosing a template's format reads probes.
PARSE_ROOMS: dict[str, int] = {
    "reply": 0,
    "encodings": 1,
    "formats": 2,
    "reading": 3,
    "choice": 4,
    "transcript": 5,
    "__init__": 6,
}


@pytest.mark.parametrize("path", sorted((SRC / "parse").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_parse_rooms(path: Path) -> None:
    """parse/ is cut by concept into rooms that import only downwards, so each can be read without the ones above
    it: a reading never chooses a format, and a format never runs a reader."""
    room = path.relative_to(SRC / "parse").with_suffix("").parts[0]
    assert room in PARSE_ROOMS, f"parse/{room} has no room: add it to PARSE_ROOMS and to parse/__init__.py's map"
    for line, target in _room_imports(ast.parse(path.read_text(encoding="utf-8")), "parse"):
        assert target in PARSE_ROOMS, f"parse/{path.relative_to(SRC / 'parse')}:{line} imports parse.{target}"
        assert target == room or PARSE_ROOMS[target] < PARSE_ROOMS[room], (
            f"parse/{path.relative_to(SRC / 'parse')}:{line} imports parse.{target}, a room above parse.{room} "
            "(src/turnkit/parse/__init__.py)"
        )


def test_every_parse_module_is_used() -> None:
    """A parse module nothing imports is dead code (the old parse/scanner.py was): it goes, or something uses it."""
    imported: set[str] = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("turnkit.parse"):
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    for path in sorted((SRC / "parse").rglob("*.py")):
        if path.name == "__init__.py":
            continue
        module = ".".join(("turnkit", *path.relative_to(SRC).with_suffix("").parts))
        assert module in imported, f"{module} is imported by no module of src/turnkit"


#: The size rule holds for all of src/: the reply engine, derivation, the data pipeline, the server's rooms and its
#: engines were split by concept (issues 36 and 47); a room that grows past it is split the same way.
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_rooms_a_reader_can_hold(path: Path) -> None:
    """No module over 600 lines and no class over 400: a room longer than that holds more than one concept (split it
    by concept, as docs/architecture.md draws them), or says in docs/architecture.md why it is one."""
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(SRC)} is {lines} lines (at most {MAX_MODULE_LINES})"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            assert size <= MAX_CLASS_LINES, (
                f"{path.relative_to(SRC)}:{node.lineno}: class {node.name} is {size} lines (at most {MAX_CLASS_LINES})"
            )


def _names_encoding(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "encoding") or (
        isinstance(node, ast.Attribute) and node.attr == "encoding"
    )


def _is_text(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(_is_text(e) for e in node.elts)


@pytest.mark.parametrize(
    "path",
    [p for p in _modules() if not p.is_relative_to(SRC / "parse" / "encodings")],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_argument_encodings_are_asked_of_their_table(path: Path) -> None:
    """No switch on an argument encoding's name outside parse/encodings/: a module asks the encoding's row
    (``encoding_of(spec).holds_name``, ``args.encoding.reading``), so a new encoding is its module and one row of the
    table (docs/architecture.md, "Where a change goes")."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            assert not (any(map(_names_encoding, operands)) and any(map(_is_text, operands))), (
                f"{path.relative_to(SRC)}:{node.lineno} compares an encoding with its name; ask its row in "
                "turnkit.parse.encodings instead"
            )


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


@pytest.mark.parametrize(
    "path", [p for p in _modules() if p != SRC / "errors.py"], ids=lambda p: str(p.relative_to(SRC))
)
def test_every_exception_class_lives_in_errors_py(path: Path) -> None:
    """Every error and warning turnkit defines is in errors.py, drawn in its tree (docs/architecture.md, "Adding
    things"); only a private signal between two functions of one module (``_Raised``) may stay beside them."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            bases = [_base_name(base) for base in node.bases]
            assert not any(name.endswith(("Error", "Exception", "Warning", "Raised")) for name in bases), (
                f"{path.relative_to(SRC)}:{node.lineno}: class {node.name}({', '.join(bases)}) belongs in errors.py"
            )


def _names_mode(node: ast.expr) -> bool:
    return (isinstance(node, ast.Name) and node.id == "mode") or (
        isinstance(node, ast.Attribute) and node.attr == "mode"
    )


@pytest.mark.parametrize("path", sorted((SRC / "parse").rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_the_reply_engine_has_no_string_mode(path: Path) -> None:
    """The reading's mode is a type (parse/reading/modes.py: one class per mode, holding its own data), never a string
    compared here and assigned there."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            assert not (any(map(_names_mode, operands)) and any(map(_is_text, operands))), (
                f"{path.relative_to(SRC)}:{node.lineno} compares a mode with a string"
            )
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            assert not (any(map(_names_mode, targets)) and node.value is not None and _is_text(node.value)), (
                f"{path.relative_to(SRC)}:{node.lineno} assigns a string mode"
            )


def test_the_tests_mirror_the_packages() -> None:
    """``tests/`` mirrors the source (docs/contributing.md, "What each test file covers"): a folder of test modules is
    named after a package of turnkit, and a test module's file name is unique across folders, since pytest imports each
    by that name (a second one would be an import error, or another module's tests run in its place)."""
    tests = REPO / "tests"
    modules = sorted(tests.rglob("test_*.py"))
    packages = {path.name for path in SRC.iterdir() if (path / "__init__.py").exists()}
    folders = {module.parent.relative_to(tests).as_posix() for module in modules} - {"."}
    strays = sorted(folders - packages)
    assert strays == [], f"test folders that name no package of src/turnkit: {strays}"
    names = Counter(module.name for module in modules)
    twice = sorted(str(module.relative_to(tests)) for module in modules if names[module.name] > 1)
    assert twice == [], f"test modules named alike in two folders: {twice}"
