"""The reply formats turnkit knows by name: data, one entry per syntax the serving peers parse (their parser names
are noted), run by the one machine.

A template's format is chosen by rendering (:mod:`turnkit.parse.choice.select`): the first of these that reads every
probe message the template writes, else a reading derived from the renders themselves
(:mod:`turnkit.parse.choice.derive`). A name here can also be given as ``reply_format=`` to override the choice.
"""

from __future__ import annotations

from turnkit.errors import UnknownReplyFormatError
from turnkit.parse.formats import Arguments, Channels, Reasoning, ReplyFormat, ToolSyntax, tool_syntax

__all__ = ["REPLY_FORMATS", "get"]

_THINK = Reasoning("<think>", "</think>")
_THINK_PREFILLED = Reasoning("<think>", "</think>", prefilled=True)

_JSON = Arguments("json")
_HERMES_CALL = Arguments("json_call", keys=("arguments", "parameters"))
_LLAMA_CALL = Arguments("json_call", keys=("parameters", "arguments"))
_TAGGED = Arguments("tagged")
_PYTHON = Arguments("python")

HERMES = tool_syntax("<tool_call>{args}</tool_call>", _HERMES_CALL)
_QWEN3_PARAM = "<parameter={key}>\n{value}\n</parameter>\n"
QWEN3_CODER = (
    tool_syntax("<tool_call>\n<function={name}>\n{args}</function>\n</tool_call>", _TAGGED, param=_QWEN3_PARAM),
    tool_syntax("<function={name}>\n{args}</function>", _TAGGED, param=_QWEN3_PARAM),  # without <tool_call>
)
GLM = tool_syntax(
    "<tool_call>{name}\n{args}</tool_call>", _TAGGED, param="<arg_key>{key}</arg_key>\n<arg_value>{value}</arg_value>\n"
)
LLAMA3 = (
    tool_syntax("{args}", _LLAMA_CALL, separator=";", bare=True),
    tool_syntax("<|python_tag|>{args}", _LLAMA_CALL, block=("", ""), separator=";"),
)
MISTRAL = (
    tool_syntax("{args}", _HERMES_CALL, block=("[TOOL_CALLS] [", "]"), separator=","),  # pre-v11: a JSON list
    tool_syntax("{args}", _HERMES_CALL, block=("[TOOL_CALLS]", ""), separator=","),  # ... or bare objects
    tool_syntax("[TOOL_CALLS]{name}[CALL_ID]{id}[ARGS]{args}", _JSON),  # Small 3.2
    tool_syntax("[TOOL_CALLS]{name}[ARGS]{args}", _JSON),  # v11+
    tool_syntax("[TOOL_CALLS]{name}{args}", _JSON),  # v11+ without [ARGS]
)
DEEPSEEK_BLOCK = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
DEEPSEEK_V3 = tool_syntax(
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>",
    _JSON,
    block=DEEPSEEK_BLOCK,
)
DEEPSEEK_V31 = tool_syntax(
    "<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>", _JSON, block=DEEPSEEK_BLOCK
)
_DSML_PARAM = '<｜DSML｜parameter name="{key}" string="{type}">{value}</｜DSML｜parameter>\n'
_DSML_ARGS = Arguments("tagged", raw_types=("true",))
DEEPSEEK_V32 = tool_syntax(
    '<｜DSML｜invoke name="{name}">\n{args}</｜DSML｜invoke>\n',
    _DSML_ARGS,
    param=_DSML_PARAM,
    block=("<｜DSML｜function_calls>\n", "</｜DSML｜function_calls>"),
)
DEEPSEEK_V4 = tool_syntax(
    '<｜DSML｜invoke name="{name}">\n{args}</｜DSML｜invoke>\n',
    _DSML_ARGS,
    param=_DSML_PARAM,
    block=("<｜DSML｜tool_calls>\n", "</｜DSML｜tool_calls>"),
)
KIMI_K2_CALL = "<|tool_call_begin|>{named_id}<|tool_call_argument_begin|>{args}<|tool_call_end|>"
KIMI_K2 = (
    tool_syntax(KIMI_K2_CALL, _JSON, block=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>")),
    tool_syntax(KIMI_K2_CALL, _JSON),  # the section's markers left out
)
MINIMAX_M2 = tool_syntax(
    '<invoke name="{name}">\n{args}</invoke>\n',
    _TAGGED,
    param='<parameter name="{key}">{value}</parameter>\n',
    block=("<minimax:tool_call>\n", "</minimax:tool_call>"),
)
_M3 = "]<]minimax[>["
MINIMAX_M3 = tool_syntax(
    _M3 + '<invoke name="{name}">{args}' + _M3 + "</invoke>\n",
    Arguments("xml", quote=_M3),
    block=(_M3 + "<tool_call>\n", _M3 + "</tool_call>"),
)
SEED_OSS = tool_syntax(
    "<seed:tool_call>\n<function={name}>\n{args}</function>\n</seed:tool_call>",
    _TAGGED,
    param="<parameter={key}>{value}</parameter>\n",
)
_STEP3_PARAM = '<steptml:parameter name="{key}">{value}</steptml:parameter>'
_STEP3_BLOCK = ("<｜tool_calls_begin｜>", "<｜tool_calls_end｜>")
STEP3 = (
    tool_syntax(
        '<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{name}">{args}</steptml:invoke>'
        "<｜tool_call_end｜>",
        _TAGGED,
        param=_STEP3_PARAM,
        block=_STEP3_BLOCK,
        separator="<｜tool_sep｜>",
    ),
    tool_syntax(  # "function<｜tool_sep｜>" left out
        '<｜tool_call_begin｜><steptml:invoke name="{name}">{args}</steptml:invoke><｜tool_call_end｜>',
        _TAGGED,
        param=_STEP3_PARAM,
        block=_STEP3_BLOCK,
        separator="<｜tool_sep｜>",
    ),
)
MIMO = tool_syntax(  # MiMo's parser keeps a value's text verbatim, newlines included
    "<tool_call>\n<function={name}>\n{args}</function>\n</tool_call>",
    _TAGGED,
    param="<parameter={key}>{value}</parameter>\n",
)
MINICPM5 = tool_syntax(  # a value holding <, & or a newline is wrapped in <![CDATA[...]]>
    '<function name="{name}">{args}</function>',
    Arguments("tagged", cdata=True),
    param='<param name="{key}">{value}</param>',
)
PYTHONIC = tool_syntax("{name}({args})", _PYTHON, block=("[", "]"), separator=",", bare=True)
LLAMA4_PYTHONIC = (
    tool_syntax("{name}({args})", _PYTHON, block=("<|python_start|> [", "] <|python_end|>"), separator=","),
    PYTHONIC,
)
LFM2 = (
    tool_syntax("{name}({args})", _PYTHON, block=("<|tool_call_start|> [", "] <|tool_call_end|>"), separator=","),
    tool_syntax("{args}", _HERMES_CALL, block=("<|tool_call_start|> [", "] <|tool_call_end|>"), separator=","),
)
OLMO3 = tool_syntax("{name}({args})", _PYTHON, block=("<function_calls>", "</function_calls>"), separator="\n")
GEMMA4 = (
    tool_syntax("<|tool_call>call:{name}{args}<tool_call|>", Arguments("gemma")),
    tool_syntax("<|tool_call>:{name}{args}<tool_call|>", Arguments("gemma")),  # the bare opener
)
FUNCTIONGEMMA = tool_syntax(
    "<start_function_call>call:{name}{args}<end_function_call>", Arguments("gemma", quote="<escape>")
)


def _json_list(start: str, end: str, arguments: Arguments = _HERMES_CALL) -> ToolSyntax:
    return tool_syntax("{args}", arguments, block=(start, end), separator=",")


COHERE = _json_list(
    "<|START_ACTION|> [", "] <|END_ACTION|>", Arguments("json_call", name_key="tool_name", keys=("parameters",))
)
GRANITE = (_json_list("<|tool_call|> [", "]"), _json_list("<tool_call> [", "]"))
JAMBA = _json_list("<tool_calls> [", "] </tool_calls>")
NEMOTRON = _json_list("<TOOLCALL> [", "] </TOOLCALL>")
PHI4_MINI = _json_list("functools [", "]")
APERTUS = _json_list("<|tools_prefix|> [", "] <|tools_suffix|>", Arguments("json_call", name_as_key=True))
XLAM = tool_syntax("{args}", _HERMES_CALL, block=("[", "]"), separator=",", bare=True)
INTERNLM = tool_syntax("<|action_start|><|plugin|>\n{args}<|action_end|>", _LLAMA_CALL)
GRANITE_20B = tool_syntax("<function_call>{args}", _HERMES_CALL)
FUNCTIONARY_31 = tool_syntax("<function={name}>{args}</function>", _JSON)
GIGACHAT3 = (
    tool_syntax("<|message_sep|>\n\nfunction call<|role_sep|>\n{args}", _HERMES_CALL),
    tool_syntax("<|function_call|>{args}", _HERMES_CALL),
)

HARMONY = Channels(
    start="<|start|>",
    header_end="<|message|>",
    message_ends=("<|end|>", "<|call|>", "<|return|>"),
    channel="<|channel|>",
    routes=(("analysis", "reasoning"), ("final", "content"), ("commentary", "content")),
    tool_prefix="functions.",
    constrain="<|constrain|>",
)
FUNCTIONARY_V32 = Channels(start=">>>", header_end="\n", routes=(("all", "content"),), recipient="", tool_prefix="")
GLIMMER = Channels(
    start="<|start|>",
    header_end="<|message|>",
    message_ends=("<|eom|>", "<|eot|>"),
    routes=(("self", "reasoning"), ("user", "content")),
)
GLIMMER_TOOLS = tool_syntax(
    '<atem:invoke name="{name}">\n{args}</atem:invoke>\n',
    _TAGGED,
    param='<atem:parameter name="{key}">{value}</atem:parameter>\n',
    block=("<atem:function_calls>\n", "</atem:function_calls>"),
)

_COHERE_CONTENT = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")


def _format(name: str, *tools: ToolSyntax | tuple[ToolSyntax, ...], **kwargs: object) -> ReplyFormat:
    flat: list[ToolSyntax] = []
    for item in tools:
        flat.extend(item if isinstance(item, tuple) else (item,))
    return ReplyFormat(name, tools=tuple(flat), **kwargs)  # type: ignore[arg-type]


REPLY_FORMATS: dict[str, ReplyFormat] = {
    f.name: f
    for f in (
        ReplyFormat("plain"),
        _format("hermes", HERMES),  # vLLM hermes; Hermes 2/3, Qwen2.5
        _format("qwen3", HERMES, reasoning=_THINK),  # Qwen3, QwQ
        ReplyFormat("reasoning", _THINK),  # DeepSeek-R1 and its distillations
        _format("qwen3_coder", *QWEN3_CODER, reasoning=_THINK),  # vLLM qwen3_coder/qwen3_xml; Qwen3.5, Nemotron 3
        _format("glm45", GLM, reasoning=_THINK),  # vLLM glm45/glm47; GLM-4.5..4.7, Ling 3, Laguna
        _format("llama3", *LLAMA3),  # vLLM llama3_json
        _format("mistral", *MISTRAL, reasoning=Reasoning("[THINK]", "[/THINK]")),  # vLLM mistral
        _format("deepseek_v3", DEEPSEEK_V3, reasoning=_THINK),
        _format("deepseek_v31", DEEPSEEK_V31, reasoning=_THINK),
        _format("deepseek_v32", DEEPSEEK_V32, reasoning=_THINK),
        _format("deepseek_v4", DEEPSEEK_V4, reasoning=_THINK),
        _format("kimi_k2", *KIMI_K2, reasoning=_THINK),
        _format("minimax_m2", MINIMAX_M2, reasoning=_THINK_PREFILLED),
        _format("minimax_m3", MINIMAX_M3, reasoning=Reasoning("<mm:think>", "</mm:think>")),
        _format("seed_oss", SEED_OSS, reasoning=Reasoning("<seed:think>", "</seed:think>")),
        _format("step3", *STEP3, reasoning=_THINK_PREFILLED),
        _format("mimo", MIMO, reasoning=_THINK),
        _format("minicpm5", MINICPM5, reasoning=_THINK),
        _format("pythonic", PYTHONIC),
        _format("llama4_pythonic", *LLAMA4_PYTHONIC),
        _format("lfm2", *LFM2, reasoning=_THINK),
        _format("olmo3", OLMO3, reasoning=_THINK),
        # Gemma 4 writes stray channel markers: a lone <|channel> is dropped
        _format("gemma4", *GEMMA4, reasoning=Reasoning("<|channel>", "<channel|>", label="thought")),
        _format("functiongemma", FUNCTIONGEMMA),
        _format(
            "cohere",
            COHERE,
            reasoning=Reasoning("<|START_THINKING|>", "<|END_THINKING|>"),
            content_markers=_COHERE_CONTENT,
        ),
        _format("granite", *GRANITE),
        _format("jamba", JAMBA),
        _format("nemotron_json", NEMOTRON, reasoning=_THINK),
        _format("phi4_mini_json", PHI4_MINI),
        _format("apertus", APERTUS),
        _format("xlam", XLAM),
        _format("internlm", INTERNLM),
        _format("granite_20b_fc", GRANITE_20B),
        _format("functionary_v31", FUNCTIONARY_31),
        _format("gigachat3", *GIGACHAT3),
        ReplyFormat("harmony", channels=HARMONY),  # gpt-oss
        ReplyFormat("functionary_v32", channels=FUNCTIONARY_V32),
        _format("glimmer", GLIMMER_TOOLS, channels=GLIMMER),  # muse glimmer
    )
}


def get(name: str) -> ReplyFormat:
    try:
        return REPLY_FORMATS[name]
    except KeyError:
        raise UnknownReplyFormatError(f"no reply format {name!r}; the formats are {sorted(REPLY_FORMATS)}") from None
