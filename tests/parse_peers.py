"""The serving peers' own parse vectors (``../shared/conformance/peers/``), run through turnkit's parser.

Each loader yields cases with what turnkit got and what the peer expects, compared the way the peer's test compares
(``../shared/conformance/README.md`` says how for each file). Run it as a script for a per-file count and the
failures: ``.venv/bin/python tests/parse_peers.py [FILE_SUBSTRING] [-v]``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))


from corpus import PEERS, TEMPLATES, manifest

from turnkit import ChatFormat, TurnkitError
from turnkit.parse import Reply


@dataclass
class Result:
    file: str
    case: str
    ok: bool
    detail: str = ""
    #: Why turnkit differs, when it does on purpose (a stated decision); None for a plain failure.
    difference: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _json(name: str) -> Any:
    return json.loads((PEERS / name).read_text(encoding="utf-8"))


# -- llama.cpp: test-chat.cpp's parse cases, each with its template ---------------------------------------------------


@cache
def _template(file: str) -> ChatFormat:
    entry = manifest()[file]
    tokens = {k: entry[k] for k in ("bos_token", "eos_token") if entry.get(k) is not None}
    return ChatFormat.from_template((TEMPLATES / file).read_text(encoding="utf-8"), **tokens)


def _llamacpp_tools(data: dict[str, Any], keys: list[str]) -> list[dict[str, Any]] | None:
    if not keys:
        return None
    tools = []
    for key in keys:
        spec = {k: v for k, v in data["tools"][key].items() if k != "parameters_text"}
        tools.append({"type": "function", "function": spec})
    return tools


def _same_arguments(got: str, want: dict[str, Any]) -> bool:
    if want.get("arguments_as") == "string_unparseable":
        try:
            json.loads(got)
        except ValueError:
            return True
        return False
    try:
        value = json.loads(got)
    except ValueError:
        return False
    return (
        value == want["arguments"] and list(value) == list(want["arguments"])
        if isinstance(value, dict)
        else (value == want["arguments"])
    )


#: Decisions where turnkit differs from llama.cpp's expectation on purpose, by what the case asks.
LLAMACPP_DECISIONS = {
    "reasoning_format_none": "llama.cpp's reasoning_format=none returns the reasoning as content with its markers "
    "(and the generation prompt's own <think> prepended); turnkit always separates reasoning into "
    "reasoning_content and has no such switch: a client that wants the raw text reads the raw text",
    "prompt_refused": "turnkit refuses to render the case's prompt (continue_final_message where the template drops "
    "or rewrites the final message, or a variable the template reads that nobody passes), so the reply's starting "
    "state is taken from the case's options instead",
    "call_in_reasoning": "a tool call written inside open reasoning ends the reasoning and is a call (as vLLM's and "
    "SGLang's parsers read it); llama.cpp looks ahead and keeps it as reasoning text when a </think> follows, which "
    "a stream cannot know when the call is read",
    "response_format_fence": "llama.cpp strips a Markdown code fence around a json_schema reply; turnkit returns the "
    "text the model wrote (its server enforces response_format with a grammar, so no fence is generated)",
    "unclosed_think_template": "the template renders a final reply after an unclosed <think>, so a reply's text "
    "after that prompt reads as the template writes it; llama.cpp reads text before a later </think> as reasoning",
    "lone_reasoning_end": "text before a </think> that nothing opened stays content: the generation prompt does not "
    "open reasoning and the template writes replies without it, and a stream cannot take back text it sent as "
    "content; llama.cpp reads it as reasoning",
    "reasoning_prefill": "llama.cpp prepends the generation prompt's own reasoning prefill ('Here are my reasoning "
    "steps:') to the reasoning; turnkit returns what the model wrote",
    "builtin_recipient": "a Harmony message to a built-in recipient (container.exec, python) is kept as a call with "
    "its status rather than dropped (never silent loss); llama.cpp drops it",
    "repeated_reasoning_start": "a reasoning start the model repeats after the prompt opened reasoning (<think> "
    "again) is absorbed, as vLLM's parsers do; llama.cpp keeps it as reasoning text",
}

#: Which decision each llama.cpp case that differs falls under (exact: a listed case that passes fails the test).
LLAMACPP_DIFFERENCES = {
    "Qwen3.5-4B.jinja:2377#14": "repeated_reasoning_start",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja:2648#31": "response_format_fence",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja:2660#32": "call_in_reasoning",
    "LFM2.5-8B-A1B.jinja:5259#289": "call_in_reasoning",
    "Reka-Edge.jinja:5385#303": "call_in_reasoning",
    "NVIDIA-Nemotron-Nano-v2.jinja:5852#335": "unclosed_think_template",
    "NVIDIA-Nemotron-Nano-v2.jinja:5858#336": "unclosed_think_template",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja:6066#365": "lone_reasoning_end",
    "Apriel-1.6-15b-Thinker-fixed.jinja:6211#390": "reasoning_prefill",
    "Apriel-1.6-15b-Thinker-fixed.jinja:6219#391": "reasoning_prefill",
    "Apriel-1.6-15b-Thinker-fixed.jinja:6239#393": "reasoning_prefill",
    "meta-llama-Llama-3.1-8B-Instruct.jinja:6302#402": "response_format_fence",
    "openai-gpt-oss-120b.jinja:6547#428": "builtin_recipient",
    "openai-gpt-oss-120b.jinja:6556#429": "builtin_recipient",
}


def _openai_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama.cpp's test messages as a transformers user writes them: calls in OpenAI shape with their arguments as
    objects, and no empty reasoning or call lists."""
    out = []
    for message in messages:
        message = {k: v for k, v in message.items() if v not in ("", [], None) or k == "content"}
        calls = []
        for call in message.get("tool_calls", []):
            arguments = call.get("arguments")
            if isinstance(arguments, str):
                with contextlib.suppress(ValueError):
                    arguments = json.loads(arguments)
            entry = {"type": "function", "function": {"name": call["name"], "arguments": arguments}}
            if call.get("id"):
                entry["id"] = call["id"]
            calls.append(entry)
        if calls:
            message["tool_calls"] = calls
        out.append(message)
    return out


def llamacpp_cases(verbose: bool = False) -> Iterator[Result]:
    data = _json("llamacpp_parse_cases.json")
    for case in data["cases"]:
        file = case["template"].rsplit("/", 1)[-1]
        options = case["options"]
        fmt = _template(file)
        messages = _openai_messages(case.get("messages") or [{"role": "user", "content": "Hey there!"}])
        tools = _llamacpp_tools(data, case["tools"])
        kwargs: dict[str, Any] = {}
        if "enable_thinking" in options["options_set"]:
            kwargs["enable_thinking"] = options["enable_thinking"]
        continuing = options["continue_final_message"]
        prompt = None
        failure = None
        for offered in (tools, []) if tools is None else (tools,):  # a tool_use template may need a tools list
            try:
                prompt = fmt.render(
                    messages,
                    tools=offered,
                    add_generation_prompt=options["add_generation_prompt"] and continuing == "none",
                    continue_final_message={"none": False, "content": True, "reasoning": "reasoning_content"}[
                        continuing
                    ],
                    **kwargs,
                )
                break
            except TurnkitError as exc:
                failure = exc
        refused = None
        if prompt is None:
            # turnkit will not render this prompt (a continue_final_message the template rewrites, a variable it
            # reads that nobody passes): the output is still parsed, from where the case says it starts
            refused = f"the prompt does not render ({failure})"
            spec, last = fmt.reply_format, messages[-1]
            if continuing == "reasoning" and spec.reasoning is not None:
                prompt = spec.reasoning.start + (last.get("reasoning_content") or "")
            elif continuing == "content" and spec.reasoning is not None:
                prompt = spec.reasoning.start + spec.reasoning.end + (last.get("content") or "")
        reply = fmt.parse(case["output"], prompt=prompt, tools=tools)
        expected = case["expected"]
        content, reasoning = reply.content, reply.reasoning_content or ""
        if continuing != "none":  # the peer merges the message being continued with its continuation
            last = messages[-1]
            if continuing == "content":
                content = (last.get("content") or "") + content
                reasoning = (last.get("reasoning_content") or "") + reasoning
            else:
                reasoning = (last.get("reasoning_content") or "") + reasoning
        problems = []
        if content.strip() != expected["content"].strip():
            problems.append(f"content {content!r} != {expected['content']!r}")
        if reasoning.strip() != (expected["reasoning_content"] or "").strip():
            problems.append(f"reasoning {reasoning!r} != {expected['reasoning_content']!r}")
        calls = expected["tool_calls"]
        if len(reply.tool_calls) != len(calls):
            problems.append(f"calls {[(c.name, c.arguments) for c in reply.tool_calls]} != {calls}")
        else:
            for call, want in zip(reply.tool_calls, calls, strict=True):
                if call.name != want["name"] or not _same_arguments(call.arguments, want):
                    problems.append(f"call {call.name} {call.arguments} != {want['name']} {want['arguments']}")
                if want.get("id") and call.id != want["id"]:
                    problems.append(f"id {call.id!r} != {want['id']!r}")
        difference = None
        if problems and options["reasoning_format"] == "none":
            difference = "reasoning_format_none"
        elif problems and case["id"] in LLAMACPP_DIFFERENCES:
            difference = LLAMACPP_DIFFERENCES[case["id"]]
        elif problems and refused:
            difference = "prompt_refused"
            problems.append(refused)
        detail = "; ".join(problems)
        if verbose and problems:
            detail += f"\n     reason: {fmt.reply_format.reason}\n     output: {case['output']!r}"
        yield Result("llamacpp", case["id"], not problems, detail, difference)


def summarize(results: list[Result], verbose: bool) -> None:
    by_file: dict[str, list[Result]] = {}
    for result in results:
        by_file.setdefault(result.file, []).append(result)
    for file, rows in by_file.items():
        passed = sum(r.ok for r in rows)
        stated = sum(1 for r in rows if not r.ok and r.difference)
        print(f"{file}: {passed}/{len(rows)} pass, {stated} stated differences, {len(rows) - passed - stated} fail")
    for result in results:
        if not result.ok and (verbose or not result.difference):
            tag = f"[{result.difference}]" if result.difference else "FAIL"
            print(f"{tag} {result.case}: {result.detail[:1500]}")


def _reply_text(reply: Reply) -> str:
    return json.dumps({"content": reply.content, "reasoning": reply.reasoning_content})


# -- vLLM: tool-parser cases, by parser name ------------------------------------------------------------------------

#: vLLM parser names (as the vectors spell them) to turnkit's catalog formats.
VLLM_PARSERS = {
    "lfm2": "lfm2",
    "mistral (vllm.parser.mistral)": "mistral",
    "qwen3 engine (vllm.parser.qwen3; Qwen3-Coder/qwen3_xml format)": "qwen3_coder",
    "qwen3_coder": "qwen3_coder",
    "mimo (vllm.parser.mimo; qwen3_xml-style format)": "mimo",
    "deepseek_v32": "deepseek_v32",
    "deepseek_v32 engine": "deepseek_v32",
    "llama4_pythonic": "llama4_pythonic",
    "gemma4": "gemma4",
    "kimi_k2": "kimi_k2",
    "olmo3": "olmo3",
    "pythonic": "pythonic",
    "minimax_m2": "minimax_m2",
    "minimax_m2 engine": "minimax_m2",
    "granite": "granite",
    "phi4_mini_json": "phi4_mini_json",
    "internlm": "internlm",
    "glm47": "glm45",
    "glm45": "glm45",
    "deepseek_v3": "deepseek_v3",
    "deepseek_v31": "deepseek_v31",
    "granite-20b-fc": "granite_20b_fc",
    "step3": "step3",
    "jamba": "jamba",
    "seed_oss engine (vllm.parser.seed_oss)": "seed_oss",
    "hermes": "hermes",
}


def _vllm_calls_match(reply: Reply, expected: list[dict[str, Any]]) -> list[str]:
    problems = []
    if len(reply.tool_calls) != len(expected):
        return [f"calls {[(c.name, c.arguments) for c in reply.tool_calls]} != {expected}"]
    for call, want in zip(reply.tool_calls, expected, strict=True):
        if want.get("name_asserted", True) and "name" in want and call.name != want["name"]:
            problems.append(f"name {call.name!r} != {want['name']!r}")
        mode = want.get("arguments_as", "object")
        if mode == "not_asserted":
            continue
        if mode == "string":
            if call.arguments != want["arguments"]:
                try:
                    same = json.loads(call.arguments) == json.loads(want["arguments"])
                except ValueError:
                    same = False
                problems.append(
                    ("arguments (as JSON) " if same else "arguments ") + f"{call.arguments!r} != {want['arguments']!r}"
                )
            continue
        try:
            value = json.loads(call.arguments)
        except ValueError:
            problems.append(f"arguments not JSON: {call.arguments!r}")
            continue
        if mode.startswith("subset"):
            if not isinstance(value, dict) or any(value.get(k) != v for k, v in want["arguments"].items()):
                problems.append(f"arguments {value} lack {want['arguments']}")
        elif value != want["arguments"]:
            problems.append(f"arguments {value} != {want['arguments']}")
    return problems


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}


def vllm_tool_cases(verbose: bool = False) -> Iterator[Result]:
    from turnkit.parse import StreamParser
    from turnkit.parse.formats import catalog

    data = _json("vllm_tool_parser_cases.json")
    for n, case in enumerate(data["cases"]):
        name = f"{VLLM_PARSERS[case['parser']]}#{n}"
        fmt = catalog.get(VLLM_PARSERS[case["parser"]])
        parser = StreamParser(fmt, call_id=lambda i: f"call_{i}")
        chunks = case.get("deltas") or [case["model_output"]]
        for chunk in chunks:
            parser.feed_text(chunk)
        reply = parser.finish()
        problems = []
        if case["expected_tool_calls"] is not None:
            problems += _vllm_calls_match(reply, case["expected_tool_calls"])
        if case.get("expected_num_tool_calls") is not None and len(reply.tool_calls) != case["expected_num_tool_calls"]:
            problems.append(f"{len(reply.tool_calls)} calls != {case['expected_num_tool_calls']}")
        if case.get("expected_tools_called") is not None:
            called = any(c.status == "ok" for c in reply.tool_calls)
            if called != case["expected_tools_called"]:
                problems.append(f"tools_called {called} != {case['expected_tools_called']}")
        if case["content_asserted"]:
            want = case["expected_content"] or ""
            if reply.content.strip() != want.strip():
                problems.append(f"content {reply.content!r} != {want!r}")
        difference = VLLM_TOOL_DIFFERENCES.get(name)
        if problems and difference is None and _typed_with_schema(fmt, case):
            difference = "schema_not_in_vector"
        detail = "; ".join(problems)
        if verbose and problems:
            detail += f"\n     test: {case['test_name']} ({case['case_id']})\n     output: {case['model_output']!r}"
        yield Result("vllm_tool", name, not problems, detail, difference if problems else None)


def _schema_of(value: Any) -> dict[str, Any]:
    """A JSON schema of ``value``'s types (what a tool schema says of it)."""
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: _schema_of(v) for k, v in value.items()}}
    if isinstance(value, list):
        return {"type": "array", "items": _schema_of(value[0]) if value else {}}
    return {"type": "null" if value is None else _JSON_TYPES.get(type(value), "string")}


def _typed_with_schema(fmt: Any, case: dict[str, Any]) -> bool:
    """Whether the case passes when parsed with a schema of the expected arguments' types (the tools the vLLM test
    passes, which the vector does not hold)."""
    from turnkit.parse import StreamParser

    expected = case["expected_tool_calls"]
    if not expected or any(not w.get("arguments_as", "object").startswith(("object", "subset")) for w in expected):
        return False
    untyped = StreamParser(fmt)
    for chunk in case.get("deltas") or [case["model_output"]]:
        untyped.feed_text(chunk)
    calls = untyped.finish().tool_calls
    if len(calls) != len(expected):
        return False
    tools = {call.name: _schema_of(want["arguments"]) for call, want in zip(calls, expected, strict=True)}
    parser = StreamParser(fmt, tools=tools)
    for chunk in case.get("deltas") or [case["model_output"]]:
        parser.feed_text(chunk)
    reply = parser.finish()
    return not _vllm_calls_match(reply, expected)


VLLM_DECISIONS = {
    "whitespace_and_none": "turnkit drops whitespace next to reasoning markers, and returns no reasoning as None and "
    "no content as '', the same whole and streamed; vLLM's expectations keep that whitespace and differ between "
    "its streaming and non-streaming paths ('' vs None)",
    "look_behind": "vLLM's non-streaming Gemma 4 parser reads text before a lone <channel|> as reasoning (looking "
    "back); a stream cannot take back text it sent as content, and turnkit reads it as vLLM's streaming path does",
    "stray_end_marker": "a reasoning end marker that nothing opened is dropped from content; vLLM keeps it as text",
    "append_think": "minimax_m2_append_think is a vLLM display option (the reasoning left in the content with <think> "
    "added back); turnkit always separates reasoning",
    "reasoning_parser_alone": "vLLM's reasoning parser ends reasoning at a tool call and leaves the call to its tool "
    "parser as content; turnkit reads the whole reply in one pass, so with a tool syntax the call is a call (with "
    "only the reasoning syntax, as here, the call text stays in the open reasoning)",
    "odd_expectation": "the expectation has neither reasoning nor content for a reply that holds both and ends by "
    "opening another <think>",
    "force_nonempty_content": "force_nonempty_content is a vLLM request option that moves reasoning into content "
    "when no content follows; turnkit has no such option",
    "granite_phrases": "Granite 3.2's plain-text reasoning phrases ('Here is my thought process:' ... 'Here is my "
    "response:', also with \"Here's\") are not a reasoning syntax turnkit reads: no template of the corpus writes "
    "them in a reply (not done)",
    "schema_not_in_vector": "the expectation types raw values by the tool schema the vLLM test passes, which the "
    "vector does not hold; without a schema turnkit keeps a value's text (as vLLM does), and with a schema of the "
    "expected types it gives exactly the expected values (checked here, by parsing again with that schema)",
    "text_after_calls": "text the model writes after its calls is content; vLLM drops it",
    "argument_repair": "vLLM unwraps an 'arguments' or 'input' parameter that wraps the real arguments (a DeepSeek "
    "V3.2 quirk); turnkit returns the arguments as written",
    "failed_calls_kept": "a call that does not parse (no name, broken syntax, cut off) is kept with its status, error "
    "and raw text, never dropped nor turned into content; vLLM drops it, or returns its text as content, or makes "
    "up a partial call",
    "every_call_read": "every call the model wrote is read; vLLM's Mistral parser keeps only the first list or "
    "object after [TOOL_CALLS]",
    "no_search_fallback": "turnkit does not search junk after [TOOL_CALLS] for a JSON list (a repeated "
    "[TOOL_CALLS], a word before the list); the call is kept as failed",
    "vector_incomplete": "the vector's model_output holds only the first streamed piece ('<|python_start|>'); the "
    "rest of the test's stream did not make it into the vector",
    "quote_after_escape": "a single-quoted Python string that holds another single-quoted string after a "
    "backslash escape (a python -c command inside a shell command) is not read (not done)",
    "tool_choice_in_server": "tool_choice is the server's: 'required' forces the call's start into the prompt and "
    "'none' offers no tools, so the parser never sees vLLM's guided bare list",
    "tools_not_in_vector": "vLLM drops calls to tools the request did not offer; turnkit keeps them with status "
    "unknown_tool when the tools are given, and the vector holds none",
}

#: vLLM tool-parser cases where turnkit differs on purpose, by case (exact).
VLLM_TOOL_DIFFERENCES: dict[str, str] = {
    "deepseek_v31#35": "text_after_calls",
    "deepseek_v32#49": "argument_repair",
    "deepseek_v32#50": "argument_repair",
    "kimi_k2#70": "failed_calls_kept",
    "llama4_pythonic#118": "vector_incomplete",
    "gemma4#145": "failed_calls_kept",
    "gemma4#154": "failed_calls_kept",
    "gemma4#155": "failed_calls_kept",
    "gemma4#156": "failed_calls_kept",
    "gemma4#157": "failed_calls_kept",
    "lfm2#215": "quote_after_escape",
    "lfm2#216": "quote_after_escape",
    "lfm2#235": "failed_calls_kept",
    "mistral#244": "text_after_calls",
    "mistral#245": "every_call_read",
    "mistral#246": "no_search_fallback",
    "mistral#248": "every_call_read",
    "mistral#249": "every_call_read",
    "mistral#250": "every_call_read",
    "mistral#251": "failed_calls_kept",
    "mistral#253": "failed_calls_kept",
    "mistral#254": "no_search_fallback",
    "mistral#255": "no_search_fallback",
    "mistral#263": "failed_calls_kept",
    "mistral#265": "text_after_calls",
    "mistral#266": "text_after_calls",
    "mistral#267": "failed_calls_kept",
    "mistral#268": "failed_calls_kept",
    "mistral#270": "failed_calls_kept",
    "mistral#271": "failed_calls_kept",
    "mistral#272": "tool_choice_in_server",
    "mistral#273": "tool_choice_in_server",
    "mistral#277": "failed_calls_kept",
    "mistral#280": "failed_calls_kept",
    "mistral#282": "failed_calls_kept",
    "qwen3_coder#311": "failed_calls_kept",
    "qwen3_coder#312": "failed_calls_kept",
    "minimax_m2#333": "tools_not_in_vector",
    "minimax_m2#334": "tools_not_in_vector",
}

# -- vLLM: reasoning-parser cases ------------------------------------------------------------------------------------

#: vLLM reasoning parsers as turnkit reasoning syntaxes: (start, end, the reply starts inside reasoning, content
#: markers). The vectors carry no prompt; "starts inside" is what the parser assumes of its model's prompt (DeepSeek-R1
#: and its kin pre-write <think> in their generation prompts).
VLLM_REASONING: dict[str, tuple[str, str, bool, tuple[str, ...]]] = {
    "deepseek_r1": ("<think>", "</think>", True, ()),
    "qwen3": ("<think>", "</think>", True, ()),
    "gemma4": ("<|channel>", "<channel|>", False, ()),
    "granite_thinking_parser": ("<think>", "</think>", True, ()),
    "step3p5": ("<think>", "</think>", True, ()),
    "hunyuan_a13b": ("<think>", "</think>", False, ("<answer>", "</answer>")),
    "glm45": ("<think>", "</think>", True, ()),
    "hy_v3": ("<think>", "</think>", False, ()),
    "minimax_m2": ("<think>", "</think>", True, ()),
    "minimax_m3": ("<mm:think>", "</mm:think>", False, ()),
    "olmo3": ("<think>", "</think>", True, ()),
    "holo2": ("<think>", "</think>", True, ()),
    "ernie45": ("<think>", "</think>", True, ("<response>", "</response>")),
    "nemotron_v3": ("<think>", "</think>", True, ()),
    "kimi_k2": ("<think>", "</think>", True, ()),
    "TestThinkingReasoningParser": ("<test:think>", "</test:think>", True, ()),
}


def _thinking(kwargs: dict[str, Any] | None) -> bool | None:
    """What the case's chat_template_kwargs say of the prompt: thinking on (it opened reasoning), off, or nothing."""
    kwargs = kwargs or {}
    for key in ("thinking", "enable_thinking"):
        if isinstance(kwargs.get(key), bool):
            return kwargs[key]
    if "reasoning_effort" in kwargs:
        return kwargs["reasoning_effort"] != "no_think"
    if "thinking_mode" in kwargs:
        return kwargs["thinking_mode"] != "disabled"
    return None


def _vllm_reasoning_format(parser: str) -> Any:
    from turnkit.parse import Reasoning, ReplyFormat

    key = parser.split(" ")[0]
    if key in VLLM_REASONING:
        start, end, prefilled, markers = VLLM_REASONING[key]
        label = "thought" if key == "gemma4" else ""
        return ReplyFormat(key, Reasoning(start, end, prefilled, label), content_markers=markers)
    return ReplyFormat("plain")  # IdentityReasoningParser: no reasoning at all


def _norm(text: str | None) -> str:
    return (text or "").strip()


def vllm_reasoning_cases(verbose: bool = False) -> Iterator[Result]:
    from turnkit.parse import StreamParser

    data = _json("vllm_reasoning_cases.json")
    for n, case in enumerate(data["cases"]):
        key = case["parser"].split(" ")[0]
        name = f"{key}#{n}"
        fmt = _vllm_reasoning_format(case["parser"])
        kind = case["kind"]
        if kind == "is_reasoning_end_prompt":
            chat = ChatFormat.from_family("chatml")
            reply = chat.parse("x", prompt=case["prompt"], reply_format=fmt)
            ended = reply.reasoning_content is None
            ok = ended == case["expected_is_reasoning_end"]
            yield Result("vllm_reasoning", name, ok, "" if ok else f"ended {ended}", None)
            continue
        thinking = _thinking(case.get("chat_template_kwargs"))
        opened = fmt.reasoning is not None and (fmt.reasoning.prefilled if thinking is None else thinking)
        parser = StreamParser(fmt, in_reasoning=opened)
        if kind == "single_streaming_step":
            parser.feed_text(case["previous_text"] or "")
            deltas = parser.feed_text(case["delta_text"] or "")
            reasoning = "".join(d.reasoning_content or "" for d in deltas) or None
            content = "".join(d.content or "" for d in deltas) or None
            want_r, want_c = case.get("expected_reasoning_delta"), case.get("expected_content_delta")
        else:
            for chunk in case.get("deltas") or [case["output"]]:
                parser.feed_text(chunk)
            reply = parser.finish()
            reasoning, content = reply.reasoning_content, reply.content
            want_r, want_c = case["expected_reasoning"], case["expected_content"]
        exact = reasoning == want_r and (content or None) == want_c
        near = _norm(reasoning) == _norm(want_r) and _norm(content) == _norm(want_c)
        detail = f"reasoning {reasoning!r} != {want_r!r}; content {content!r} != {want_c!r}" if not exact else ""
        if verbose and not exact:
            detail += f"\n     output: {case.get('output')!r} streaming={case.get('streaming')} kind={kind}"
        difference = None
        if not exact and near:
            difference = "whitespace_and_none"
        elif not exact:
            difference = VLLM_REASONING_DIFFERENCES.get(name)
        yield Result("vllm_reasoning", name, exact, detail, difference)


VLLM_REASONING_DIFFERENCES: dict[str, str] = {
    "gemma4#32": "look_behind",
    "gemma4#34": "look_behind",
    "granite#75": "granite_phrases",
    "granite#76": "granite_phrases",
    "granite#78": "granite_phrases",
    "granite#79": "granite_phrases",
    "granite#80": "granite_phrases",
    "granite#81": "granite_phrases",
    "granite#82": "granite_phrases",
    "granite#83": "granite_phrases",
    "granite#85": "granite_phrases",
    "granite#86": "granite_phrases",
    "granite#87": "granite_phrases",
    "granite#88": "granite_phrases",
    "granite#89": "granite_phrases",
    "granite#90": "granite_phrases",
    "granite#91": "granite_phrases",
    "granite#92": "granite_phrases",
    "granite#93": "granite_phrases",
    "granite#94": "granite_phrases",
    "granite#95": "granite_phrases",
    "granite#97": "granite_phrases",
    "granite#98": "granite_phrases",
    "granite#99": "granite_phrases",
    "granite#100": "granite_phrases",
    "granite#101": "granite_phrases",
    "holo2#122": "stray_end_marker",
    "holo2#123": "stray_end_marker",
    "minimax_m2_append_think#159": "append_think",
    "minimax_m2_append_think#160": "append_think",
    "minimax_m2_append_think#161": "append_think",
    "minimax_m2_append_think#162": "append_think",
    "minimax_m2_append_think#163": "append_think",
    "minimax_m2_append_think#164": "append_think",
    "minimax_m2_append_think#165": "append_think",
    "minimax_m2_append_think#166": "append_think",
    "minimax_m2_append_think#167": "append_think",
    "minimax_m2_append_think#169": "append_think",
    "minimax_m2_append_think#170": "append_think",
    "minimax_m2_append_think#171": "append_think",
    "minimax_m2_append_think#172": "append_think",
    "qwen3#222": "reasoning_parser_alone",
    "qwen3#223": "reasoning_parser_alone",
    "qwen3#224": "reasoning_parser_alone",
    "qwen3#225": "reasoning_parser_alone",
    "qwen3#230": "reasoning_parser_alone",
    "step3p5#259": "odd_expectation",
    "TestThinkingReasoningParser#269": "stray_end_marker",
    "TestThinkingReasoningParser#270": "repeated_reasoning_start",
    "granite_thinking_parser#277": "force_nonempty_content",
    "granite_thinking_parser#279": "force_nonempty_content",
    "kimi_k2#285": "reasoning_parser_alone",
    "minimax_m3#289": "stray_end_marker",
    "minimax_m3#295": "stray_end_marker",
    "nemotron_v3#303": "force_nonempty_content",
}

# -- openai-harmony: gpt-oss completions, with openai-harmony itself as the oracle -------------------------------------


def harmony_tokens(case: dict[str, Any], encoding: Any) -> list[int]:
    """The case's token ids: given, built from its segments (ids as given, text encoded), or its text encoded."""
    if case.get("input_tokens"):
        return list(case["input_tokens"])
    if case.get("input_segments"):
        ids: list[int] = []
        for segment in case["input_segments"]:
            if "token_ids" in segment:
                ids += segment["token_ids"]
            else:
                ids += encoding.encode(segment["text"], allowed_special="all")
        return ids
    return list(encoding.encode(case["input_text"], allowed_special="all"))


def harmony_oracle(ids: list[int], encoding: Any, initial_role: str | None) -> dict[str, Any] | None:
    """What openai-harmony's lenient parser reads, as the reply turnkit should give: analysis is reasoning, a
    message to a recipient is a call (its name without ``functions.``), the rest is content. None when it reads a
    message that is not the assistant's (a tool's output)."""
    from openai_harmony import Role, StreamableParser

    parser = StreamableParser(encoding, Role.ASSISTANT if initial_role == "assistant" else None, strict=False)
    for token in ids:
        parser.process(token)
    parser.process_eos()
    reply: dict[str, Any] = {"content": "", "reasoning": "", "calls": []}
    for message in parser.messages:
        if message.author.role != Role.ASSISTANT:
            return None
        text = "".join(getattr(part, "text", "") for part in message.content)
        recipient = message.recipient
        if recipient and recipient not in ("assistant", "user"):
            reply["calls"].append((recipient.removeprefix("functions."), text))
        elif message.channel == "analysis":
            reply["reasoning"] += text
        else:
            reply["content"] += text
    return reply


HARMONY_DIFFERENCES: dict[str, str] = {
    "tool_response_parsing": "tool_message",
    "streamable_parser_file": "tool_message",
    "parse_completion_with_invalid_content_token_errors_on_eos": "unknown_id",
}
HARMONY_DECISIONS = {
    "tool_message": "the completion holds a tool's message (<|start|>browser.search to=assistant ...), which is not "
    "the assistant's reply: the reply parser has no place for it",
    "unknown_id": "an id the tokenizer has no token for (u32::MAX) is an error naming it (issue 34 item 8: a reply "
    "of another tokenizer's ids must not read as clean); openai-harmony decodes it as U+FFFD",
}


def harmony_cases(verbose: bool = False) -> Iterator[Result]:
    from harmony_vocab import harmony_vocab

    from turnkit.errors import TokenizerError
    from turnkit.parse import StreamParser
    from turnkit.parse.formats import catalog

    vocab = harmony_vocab()
    fmt = catalog.get("harmony")
    for case in _json("harmony_parse_cases.json")["cases"]:
        ids = harmony_tokens(case, vocab.encoding)
        expected = harmony_oracle(ids, vocab.encoding, case.get("initial_role"))
        parser = StreamParser(fmt, added_tokens=vocab.specials, byte_table=vocab.byte_table, call_id=lambda i: f"c{i}")
        try:
            streamed = [d for token in ids for d in parser.feed([token])]
        except TokenizerError as exc:
            yield Result("harmony", case["name"], False, str(exc), HARMONY_DIFFERENCES.get(case["name"]))
            continue
        reply = parser.finish()
        got = {
            "content": reply.content,
            "reasoning": reply.reasoning_content or "",
            "calls": [(c.name, c.arguments) for c in reply.tool_calls],
        }
        if expected is not None:  # compared up to surrounding whitespace (turnkit drops it next to markers)
            expected = {**expected, "content": expected["content"].strip(), "reasoning": expected["reasoning"].strip()}
            got = {**got, "content": got["content"].strip(), "reasoning": got["reasoning"].strip()}
        problems = []
        if expected is None:
            problems.append("openai-harmony reads a message that is not the assistant's")
        elif got != expected:
            problems.append(f"{got} != openai-harmony's {expected}")
        shown = "".join(d.content or "" for d in streamed + parser.final_deltas)
        if shown != reply.content:
            problems.append(f"the streamed content {shown!r} is not the reply's {reply.content!r}")
        difference = HARMONY_DIFFERENCES.get(case["name"]) if problems else None
        detail = "; ".join(problems)
        if verbose and problems:
            detail += f"\n     input: {case.get('input_text')!r}"
        yield Result("harmony", case["name"], not problems, detail, difference)


# -- vLLM: the format-conformance fixtures ----------------------------------------------------------------------------


def vllm_format_cases(verbose: bool = False) -> Iterator[Result]:
    """The 11 fixtures: non-streaming, the calls as (name, arguments as JSON) (content is not asserted)."""
    from turnkit.parse import StreamParser
    from turnkit.parse.formats import catalog

    for case in _json("vllm_tool_format_cases.json")["cases"]:
        name = {"qwen3_xml": "qwen3_coder"}.get(case["parser"], case["parser"])
        parser = StreamParser(catalog.get(VLLM_PARSERS.get(name, name)))
        parser.feed_text(case["model_output"])
        reply = parser.finish()
        got = [(c.name, json.loads(c.arguments) if c.status == "ok" else c.arguments) for c in reply.tool_calls]
        want = [(c["name"], c["arguments"]) for c in case["expected_tool_calls"]]
        yield Result("vllm_format", case["family"], got == want, "" if got == want else f"{got} != {want}")


LOADERS = {
    "llamacpp": llamacpp_cases,
    "vllm_format": vllm_format_cases,
    "vllm_tool": vllm_tool_cases,
    "vllm_reasoning": vllm_reasoning_cases,
    "harmony": harmony_cases,
}

if __name__ == "__main__":
    argv = sys.argv[1:]
    verbose = "-v" in argv
    wanted = [a for a in argv if not a.startswith("-")]
    results = [r for key, load in LOADERS.items() if not wanted or any(w in key for w in wanted) for r in load(verbose)]
    summarize(results, verbose)
