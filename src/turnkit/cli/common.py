"""What the commands share: reading conversation and tools files, building a ChatFormat from flags, the
flag types, the library advice rewritten as flags, and visible whitespace."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from turnkit import families
from turnkit.argtypes import positive_int
from turnkit.embedded import resolve_model
from turnkit.errors import UsageError
from turnkit.format import ChatFormat

_MARKER = re.compile(r"<\|[^\s|<>]{1,48}\|>|<｜[^｜\s]{1,48}｜>|\[/?[A-Z][A-Z_]{1,30}\]")


#: The library's advice names Python arguments and methods; a command-line user needs the flags instead. Each left
#: side is a phrase of a library message (tests/cli/test_cli.py checks that every one still occurs in the library, so a
#: reworded message cannot slip past this table); the library keeps its own wording for library users.
FLAG_ADVICE: tuple[tuple[str, str], ...] = (
    (
        "this ChatFormat has no tokenizer: build it with from_pretrained, or pass tokenizer= to from_template / "
        "from_family, or call with_tokenizer()",
        "--template and --family give no tokenizer: add --tokenizer PATH (a model folder or a .gguf file), or "
        "use --model PATH",
    ),
    ("encode with split_turns=True (see check_prefix_stable)", "rerun with --split-turns (--check-prefix shows where)"),
    ("pass allow_dropped=True", "pass --allow-dropped"),
    # a folder with no chat template (a base model's, or a tokenizer saved alone): the flags that give it one
    (
        "pass one with ChatFormat.from_template or pick a family",
        "pass one with --template FILE or --family NAME (encode, parse and inspect take the folder as --tokenizer "
        "then)",
    ),
    ("pass template_name= one of", "pass --template-name with one of"),
    (
        "continue_final_message and add_generation_prompt exclude each other",
        "--continue and --generation-prompt exclude each other",
    ),
    ("continue_final_message is set", "--continue is set"),
)


_TURNS_ADVICE = re.compile(r"\bturns='(all|last|none)'")


def command_line_message(message: str) -> str:
    """A library error message with its Python advice replaced by the command-line flags that do the same."""
    for library, flags in FLAG_ADVICE:
        message = message.replace(library, flags)
    return _TURNS_ADVICE.sub(r"--turns \1", message)


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """turnkit's own warnings (``MissingControlTokenWarning``, ``TrustedDataWarning`` ...) as one line each on stderr,
    ``turnkit: warning: MESSAGE``, once per message, like the errors: Python's default shows the file, the line number
    and the source line of the library code that warned, which tell a command-line user nothing. Warnings of other
    packages keep Python's own output."""
    shown: set[str] = set()
    default = warnings.showwarning

    def show(message: Any, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if not category.__module__.startswith("turnkit"):
            default(message, category, *args, **kwargs)
            return
        text = command_line_message(str(message))
        if text not in shown:
            shown.add(text)
            print(f"turnkit: warning: {text}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        if warnings.showwarning is show:
            warnings.showwarning = default


def read_json(path: str, what: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"{what} {path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None


def load_conversation(path: str) -> tuple[list[Any], list[Any] | None, dict[str, Any]]:
    """A conversation file is a list of messages, or an object with ``messages`` (and optional ``tools``)."""
    data = read_json(path, "conversation")
    if isinstance(data, list):
        return data, None, {}
    if isinstance(data, dict) and isinstance(data.get("messages"), list):
        extra = {k: v for k, v in data.items() if k not in ("messages", "tools")}
        return data["messages"], data.get("tools"), extra
    raise UsageError(f"conversation {path} must be a JSON list of messages or an object with a 'messages' list")


_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def hub_name(text: str) -> bool:
    """Whether ``text`` is shaped like a hub model name (``Qwen/Qwen2.5-7B-Instruct``)."""
    return _HUB_NAME.fullmatch(text) is not None


def missing_model(path: str, flag: str = "--model") -> UsageError:
    """The error for a model that is not on disk; a hub name (``Qwen/Qwen2.5-7B-Instruct``) is told how to get it.
    ``flag`` empty: a positional argument (``turnkit doctor PATH``)."""
    hint = "give a Hugging Face model folder, a .gguf file, or 'default'"
    if hub_name(path):
        hint = (
            f"turnkit reads checkpoints from disk, not from the hub: download it first (hf download {path} "
            "--local-dir DIR) and give DIR"
        )
    return UsageError(f"{flag} {path}".lstrip() + f" does not exist; {hint}")


def model_path(value: str, flag: str = "--model") -> Path:
    """The path a ``--model`` value names (``default``: the embedded model), checked to exist."""
    if value == "default":
        return resolve_model(value)
    path = Path(value)
    if not path.exists():
        raise missing_model(value, flag)
    return path


def format_from_args(args: argparse.Namespace) -> ChatFormat:
    if args.model:
        return ChatFormat.from_pretrained(model_path(args.model))
    if args.template:
        try:
            text = Path(args.template).read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read template {args.template}: {exc.strerror}") from None
        fmt = ChatFormat.from_template(text, **dict(args.token or []))
    else:
        fmt = ChatFormat.from_family(args.family)
    tokenizer = getattr(args, "tokenizer", None)
    if tokenizer:
        from turnkit.tokenizer import TokenizerBinding

        path = model_path(tokenizer, "--tokenizer")
        binding = TokenizerBinding.from_gguf(path) if path.is_file() else TokenizerBinding.from_folder(path)
        fmt = fmt.with_tokenizer(binding)
    return fmt


def load_tools(args: argparse.Namespace, tools: Any) -> Any:
    if args.tools:
        tools = read_json(args.tools, "tools file")
        if isinstance(tools, dict) and "tools" in tools:
            tools = tools["tools"]
        if not isinstance(tools, list):
            raise UsageError(f"tools file {args.tools} must hold a JSON list of tool schemas")
    return tools


def add_count(command: Any, flag: str, help: str, *, default: int | None = None) -> None:
    """A flag that takes a count (``N``, a whole number of at least 1: :func:`positive_int`): tokens, threads,
    workers, records. One spelling, so every count reads and fails alike."""
    command.add_argument(flag, type=positive_int, default=default, metavar="N", help=help)


def add_switch(command: Any, flag: str, help: str) -> None:
    """A flag that takes no value and turns something on (``store_true``)."""
    command.add_argument(flag, action="store_true", help=help)


def key_value(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def name_text(text: str) -> tuple[str, str]:
    """``NAME=TEXT`` for ``--token``: a special token is text (a JSON string literal is accepted and unquoted)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=TEXT (e.g. bos_token='<s>'), got {text!r}")
    if value.startswith('"'):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, str):
            return name, decoded
    return name, value


def add_source_arguments(command: argparse.ArgumentParser) -> None:
    """Where the format comes from: ``--model``, ``--template`` (with ``--token``) or ``--family``."""
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", metavar="PATH", help="a Hugging Face model folder, a .gguf file, or 'default'")
    source.add_argument("--template", metavar="FILE", help="a Jinja chat template file")
    source.add_argument("--family", choices=families.names(), help="a built-in family")
    add_token_argument(command)


def add_token_argument(command: argparse.ArgumentParser) -> None:
    """``--token NAME=TEXT``: the special tokens of a ``--template``, which a bare template file does not name."""
    command.add_argument(
        "--token",
        metavar="NAME=TEXT",
        type=name_text,
        action="append",
        help="a special token for --template, e.g. bos_token='<s>' (repeatable)",
    )


def add_training_arguments(command: argparse.ArgumentParser, *, turns: Sequence[str], dropped: str) -> None:
    """The flags of what is trained, the same fields of ``EncodeOptions`` for every command that encodes for training
    (``encode``, ``prepare``): ``--turns`` (``turns``: the choices the command offers), ``--no-end-marker``,
    ``--split-turns`` and ``--allow-dropped`` (``dropped``: what the command does without it)."""
    command.add_argument("--turns", choices=list(turns), default="all", help="assistant turns to train")
    add_switch(command, "--no-end-marker", "do not train the end-of-turn marker")
    add_switch(
        command,
        "--split-turns",
        "one example per trained assistant turn, each in its inference context (templates that rewrite history)",
    )
    add_switch(
        command,
        "--allow-dropped",
        f"train an assistant turn even when the template leaves out its tool calls or content (default: {dropped})",
    )


def add_format_arguments(command: argparse.ArgumentParser) -> None:
    add_source_arguments(command)
    command.add_argument("conversation", metavar="CONVERSATION.json", help="messages as JSON ('-' reads stdin)")
    command.add_argument("--tools", metavar="FILE", help="a JSON list of tool schemas")
    add_switch(command, "--generation-prompt", "end with a new assistant turn's header")
    command.add_argument("--template-name", metavar="NAME", help="a named template of the checkpoint (tool_use ...)")
    command.add_argument(
        "--var",
        metavar="KEY=VALUE",
        type=key_value,
        action="append",
        help="a template variable, JSON or text, e.g. enable_thinking=false (repeatable)",
    )


#: Names a ``--var`` cannot take, with what to do instead: what the command sets itself from the conversation file and
#: its flags. Passed as a template variable too, the value reached the call twice (a TypeError) or changed a setting
#: behind its flag. The left sides are the parameters of ``ChatFormat.render_with_spans``.
RENDER_SET = {
    "messages": "the messages come from the conversation file",
    "tools": "give tools with --tools FILE (or 'tools' in the conversation file)",
    "add_generation_prompt": "use --generation-prompt",
    "continue_final_message": "use --continue",
    "template_name": "use --template-name NAME",
    "track_generation": "it is a parameter of the render",
    "with_data_spans": "it is a parameter of the render (--show sets it)",
}


def encode_set(flags: Mapping[str, str]) -> dict[str, str]:
    """The names a ``--var`` cannot take on a command that encodes: every field of ``EncodeOptions`` is an option of
    the encoding, not a variable of the template (``--var attribution=false`` made ``encode`` print every token as
    template text of message -1), with the advice in ``flags`` where the command has a flag for it. ``documents``
    stays a variable, as it is one for transformers."""
    from turnkit.encode import EncodeOptions

    names = [f.name for f in dataclasses.fields(EncodeOptions) if f.name != "documents"]
    setting = "it is an encode setting, not a template variable"
    return {"messages": RENDER_SET["messages"], **{name: flags.get(name, setting) for name in names}}


def template_variables(
    args: argparse.Namespace, extra: Mapping[str, Any], path: str, settings: Mapping[str, str]
) -> dict[str, Any]:
    """The template variables of a command: the conversation file's ``chat_template_kwargs``, then ``--var`` (which
    wins), each checked: a name in ``settings`` is refused with the advice given there (the flag that sets it), and
    ``documents`` must be a list of objects, as every template that renders documents reads them."""
    given = extra.get("chat_template_kwargs", {})
    if not isinstance(given, dict):
        raise UsageError(
            f"conversation {path}: chat_template_kwargs must be an object of template variables, "
            f"not {json.dumps(given)[:60]}"
        )
    from_flags = dict(getattr(args, "var", None) or [])
    for name, value in {**given, **from_flags}.items():
        where = f"--var {name}" if name in from_flags else f"chat_template_kwargs.{name} in conversation {path}"
        if name in settings:
            raise UsageError(f"{where}: this command sets {name} itself; {settings[name]}")
        if name == "documents" and not (
            isinstance(value, list) and all(isinstance(document, dict) for document in value)
        ):
            raise UsageError(
                f"{where} must be a JSON list of objects (each with 'title' and 'text'), not {json.dumps(value)[:60]}"
            )
    return {**given, **from_flags}


def show_visible(text: str, markers: Sequence[str], *, color: bool, data: Sequence[tuple[int, int, int]] = ()) -> str:
    """Make whitespace visible (``·`` for spaces, ``→`` for tabs, ``↵`` before each newline) and set special
    tokens apart (reverse video on a terminal, ``⟦...⟧`` otherwise): only those the template wrote, not one that a
    message typed (``data``: the render's data spans; a typed marker is text, as ``encode`` treats it)."""
    known = sorted({m for m in markers if m}, key=len, reverse=True)
    pattern = re.compile("|".join([*map(re.escape, known), _MARKER.pattern]))
    out: list[str] = []
    last = 0
    for match in pattern.finditer(text):
        if any(start < match.end() and match.start() < end for start, end, _ in data):
            continue
        out.append(visible_whitespace(text[last : match.start()]))
        token = match.group(0)
        out.append(f"\x1b[7m{token}\x1b[0m" if color else f"⟦{token}⟧")
        last = match.end()
    out.append(visible_whitespace(text[last:]))
    return "".join(out)


def visible_whitespace(text: str) -> str:
    return text.replace(" ", "·").replace("\t", "→").replace("\n", "↵\n")


def training_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``EncodeOptions`` fields the flags of :func:`add_training_arguments` set."""
    return {
        "turns": args.turns,
        "train_end_marker": not args.no_end_marker,
        "split_turns": args.split_turns,
        "allow_dropped": args.allow_dropped,
    }


def render_options(args: argparse.Namespace) -> dict[str, Any]:
    """The render keywords of :func:`add_format_arguments`'s flags that every rendering command passes on alike."""
    return {"add_generation_prompt": args.generation_prompt, "template_name": args.template_name}


def read_conversation(
    args: argparse.Namespace, settings: Mapping[str, str]
) -> tuple[ChatFormat, list[Any], Any, dict[str, Any]]:
    """What a command that renders a conversation file works from (``render``, ``encode``): the format, the file's
    messages, its tools (``--tools`` wins) and its template variables (``settings``: the names the command sets
    itself, see :func:`template_variables`); a warning when the template does not show the tools. The file is read
    before the model, so a bad conversation fails before a long load."""
    messages, tools, extra = load_conversation(args.conversation)
    tools = load_tools(args, tools)
    fmt = format_from_args(args)
    variables = template_variables(args, extra, args.conversation, settings)
    warn_unshown_tools(fmt, messages, tools, args, variables)
    return fmt, messages, tools, variables


def warn_unshown_tools(fmt: ChatFormat, messages: Any, tools: Any, args: argparse.Namespace, variables: Any) -> None:
    """Tools the template does not show (the render is the same without them) would never reach the model: say so."""
    if not tools:
        return
    options = {**render_options(args), **variables}
    if fmt.render(messages, tools=tools, **options) == fmt.render(messages, **options):
        print(
            "turnkit: warning: this chat template does not show tools (the render is the same without them); "
            "the model would never see them (turnkit serve refuses such requests)",
            file=sys.stderr,
        )
