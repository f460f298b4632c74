"""turnkit's vLLM plugin inside vLLM's own OpenAI server: ``python -m vllm.entrypoints.openai.api_server`` (the CPU
build's ``vllm serve``) as a subprocess with ``--tokenizer-mode turnkit --enable-auto-tool-choice --tool-call-parser
turnkit --reasoning-parser turnkit`` on the embedded model as a Hugging Face folder, through the official openai
client; and the plugin's objects in process, in vLLM's own renderer and parser interfaces (no server).

The served folder holds the embedded model's weights with a Qwen-style template of its own
(tests/serve/test_serve_tools.py's Qwen3-Coder syntax, the embedded model's default system prompt, ``<think>``
reasoning): one template that shows the forged turn, tool calls and reasoning, so one vLLM start serves the module. A
small model writes a call or a ``<think>`` block only when told to: vLLM's own ``structured_outputs`` (a regex) makes it
write them in the template's syntax, and the plugin reads them with no per-model flag.

It runs in ``.venv-vllm`` (``./dev.sh vllm-test``; ``./dev.sh test`` under ``CI=true``); in ``.venv`` it skips. The
server's start (3-5 minutes on 2 cores, mostly compiling) is most of the module's time.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm",
    reason="vLLM is not installed in this venv: tests/vllm_plugin/test_vllm_plugin.py runs in .venv-vllm "
    "(./dev.sh vllm-setup, then ./dev.sh vllm-test)",
)

import httpx
from openai import OpenAI
from parse_peers import LOADERS, VLLM_PARSERS, Result, _json, _vllm_calls_match, _vllm_reasoning_format
from serve_harness import free_port, wait_until_up
from test_serve_tools import QWEN3_CODER_STYLE, TOOLS, UNREADABLE
from test_serve_vllm import FORGED

from turnkit import ChatFormat
from turnkit.parse import ParsedToolCall, Reply
from turnkit.parse.formats import catalog
from turnkit.vllm_plugin import MODE, TESTED, interface_problems, mismatch_message, register, vllm_release

#: The served template: tests/serve/test_serve_tools.py's Qwen3-Coder-style template with the embedded model's default
#: system turn (so a forged turn reads as in the embedded model's own template: 3 ``<|im_start|>``) and reasoning.
SERVED_TEMPLATE = (
    QWEN3_CODER_STYLE.replace(
        "message.role == 'system' or (loop.first and tools)", "message.role == 'system' or loop.first"
    )
    .replace(
        "{% if message.role == 'system' %}{{ message.content }}{% endif %}",
        "{% if message.role == 'system' %}{{ message.content }}{% else %}You are a helpful AI assistant named SmolLM, "
        "trained by Hugging Face{% endif %}",
    )
    .replace(
        "{%- if message.role == 'assistant' %}<|im_start|>assistant\n",
        "{%- if message.role == 'assistant' %}<|im_start|>assistant\n{% if message.reasoning_content %}<think>\n"
        "{{ message.reasoning_content }}\n</think>\n\n{% endif %}",
    )
)
FLAGS = ("--tokenizer-mode", MODE, "--enable-auto-tool-choice", "--tool-call-parser", MODE, "--reasoning-parser", MODE)
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def _folder(root: Path, weights: Path, tokenizer: Path, template: str) -> Path:
    """A model folder: the converted weights (linked), the tokenizer's files and ``template`` as its own."""
    root.mkdir()
    for source in [*weights.iterdir(), *tokenizer.iterdir()]:
        if source.name != "chat_template.jinja":
            (root / source.name).symlink_to(source)
    (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def model_folder(smollm2_gguf, smollm2_hf_folder, tmp_path_factory) -> Path:
    from turnkit.serve.engines.torch import _converted_gguf

    return _folder(
        tmp_path_factory.mktemp("vllm-plugin") / "smollm2",
        _converted_gguf(smollm2_gguf),
        smollm2_hf_folder,
        SERVED_TEMPLATE,
    )


@pytest.fixture(scope="module")
def fmt(model_folder) -> ChatFormat:
    return ChatFormat.from_pretrained(model_folder)


class _Server:
    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log
        self.client = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def server(model_folder) -> Iterator[_Server]:
    """vLLM's OpenAI server with the plugin's flags, once for the module (the CPU build: ``vllm serve`` is
    ``python -m vllm.entrypoints.openai.api_server`` there, as its console script looks for a ``vllm``
    distribution)."""
    port = free_port()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_folder),
        "--served-model-name", "smollm2", *FLAGS, "--dtype", "bfloat16", "--max-model-len", "2048",
        "--max-num-seqs", "4", "--trust-request-chat-template", "--enforce-eager", "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="2")
    log = Path(os.environ.get("TMPDIR", "/tmp")) / f"turnkit-vllm-plugin-{port}.log"
    started = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_until_up(url, process, timeout=1200)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}; the server's log ends:\n{log.read_text(errors='replace')[-4000:]}") from None
        print(f"vLLM's server with the turnkit plugin up in {time.monotonic() - started:.0f} s")
        yield _Server(url, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


# -- the renderer: a forged turn stays text ---------------------------------------------------------------------------


def _renderers(folder: Path) -> dict[str, Any]:
    """vLLM's own HF renderer and the plugin's, in process, built by vLLM from its config as its server builds them."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.renderers.registry import renderer_from_config

    register()
    out = {}
    for mode in ("hf", MODE):
        config = EngineArgs(model=str(folder), tokenizer_mode=mode, dtype="bfloat16", max_model_len=2048)
        out[mode] = renderer_from_config(config.create_engine_config())
    return out


def _rendered(renderer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
    from vllm.renderers.params import ChatParams

    _conversation, prompt = renderer.render_messages(
        messages, ChatParams(chat_template_kwargs={"add_generation_prompt": True, **kwargs})
    )
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    return renderer.get_tokenizer().encode(prompt["prompt"], add_special_tokens=False)


def test_a_forged_turn_reaches_vllm_as_fmt_encode_gives_it(server, fmt, model_folder):
    """vLLM runs ``fmt.encode``'s ids (3 ``<|im_start|>``: the default system turn, the user's, the reply's), as its
    own ``prompt_token_ids`` and ``/tokenize`` report; vLLM's own renderer, in process on the same folder, makes 5 of
    the same message (the user's text became two more turns)."""
    messages = [{"role": "user", "content": FORGED}]
    expected = [int(t) for t in fmt.encode(messages, add_generation_prompt=True).input_ids]
    start = fmt.tokenizer.token_to_id("<|im_start|>")
    reply = server.client.chat.completions.create(
        model="smollm2", messages=messages, temperature=0, max_tokens=4, extra_body={"return_token_ids": True}
    )
    assert reply.model_extra["prompt_token_ids"] == expected
    assert reply.usage.prompt_tokens == len(expected)
    tokenized = httpx.post(server.url + "/tokenize", json={"model": "smollm2", "messages": messages}).json()
    assert tokenized["tokens"] == expected
    assert sum(t == start for t in expected) == 3
    renderers = _renderers(model_folder)
    assert _rendered(renderers[MODE], messages) == expected
    plain = _rendered(renderers["hf"], messages)
    assert sum(t == start for t in plain) == 5  # plain vLLM: the forged markers became real turns
    # elsewhere the same ids as vLLM's own: a plain question, and a tool call and its result with the tools shown
    clean = [{"role": "user", "content": "What is the capital of France?"}]
    assert _rendered(renderers[MODE], clean) == _rendered(renderers["hf"], clean)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    loop = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]}]
    loop.append({"role": "tool", "tool_call_id": "c1", "content": "sunny"})
    assert _rendered(renderers[MODE], loop, tools=TOOLS) == _rendered(renderers["hf"], loop, tools=TOOLS)


def test_a_chat_template_other_than_the_checkpoints_is_a_400(server):
    """The parsers read replies by the checkpoint's template, so a request's own template is refused, not rendered
    (the server trusts request templates, so the refusal is the plugin's)."""
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": MESSAGES, "chat_template": UNREADABLE, "max_tokens": 4},
    )
    assert response.status_code == 400, response.text
    assert "checkpoint's own template" in response.text


# -- replies read by the template's format ------------------------------------------------------------------------


def _streamed(stream: Any) -> dict[str, Any]:
    """A stream folded: content, reasoning, calls by index, finish reason."""
    content, reasoning, finish = "", "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning") or ""
        for piece in delta.tool_calls or []:
            entry = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = entry["id"] or piece.id
            entry["name"] += (piece.function.name or "") if piece.function else ""
            entry["arguments"] += (piece.function.arguments or "") if piece.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return {"content": content, "reasoning": reasoning, "calls": list(calls.values()), "finish": finish}


def _whole_and_streamed(server: _Server, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    request: dict[str, Any] = {"model": "smollm2", "messages": MESSAGES, "temperature": 0, "max_tokens": 64, **kwargs}
    return server.client.chat.completions.create(**request), _streamed(
        server.client.chat.completions.create(stream=True, **request)
    )


def test_a_call_in_the_templates_syntax_is_read_as_tool_calls_whole_and_streamed(server):
    """The model writes the template's Qwen3-Coder call (vLLM's regex constraint makes it), and the plugin reads it
    as ``tool_calls``, whole and streamed alike, with no ``--tool-call-parser`` naming the syntax."""
    written = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    whole, streamed = _whole_and_streamed(
        server, tools=TOOLS, tool_choice="auto", extra_body={"structured_outputs": {"regex": _literal(written)}}
    )
    message = whole.choices[0].message
    (call,) = message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.id and whole.choices[0].finish_reason == "tool_calls" and not message.content
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == [(call.function.name, call.function.arguments)]
    assert streamed["calls"][0]["id"] and streamed["finish"] == "tool_calls" and not streamed["content"]


def test_a_calls_token_ids_stream_as_they_come_whole_through_the_plugins_parser(server, fmt):
    """``return_token_ids`` with the plugin's tool parser: the streamed chunks' ``token_ids`` add up to the whole
    reply's (vLLM #27482 lost them in chat streams read by a tool parser), and they decode to the call the model
    wrote: what a trainer keeps of a tool-calling turn."""
    written = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    request: dict[str, Any] = {
        "model": "smollm2",
        "messages": MESSAGES,
        "temperature": 0,
        "max_tokens": 64,
        "tools": TOOLS,
        "extra_body": {"structured_outputs": {"regex": _literal(written)}, "return_token_ids": True},
    }
    whole = server.client.chat.completions.create(**request)
    ids = whole.choices[0].model_extra["token_ids"]
    assert whole.choices[0].finish_reason == "tool_calls" and ids
    streamed = [
        token
        for chunk in server.client.chat.completions.create(stream=True, **request)
        for choice in chunk.choices
        for token in (choice.model_extra or {}).get("token_ids") or []
    ]
    assert streamed == ids
    assert fmt.tokenizer.decode(ids).startswith(written)


def test_a_trajectory_samples_from_vllms_own_server_by_ids(server, fmt):
    """Token in, token out through vLLM's own server with the plugin: the engine client gives the trajectory's ids to
    vLLM's ``/v1/completions`` (``return_token_ids``, the format's stop ids), vLLM echoes them and returns the ids it
    sampled, and the trajectory keeps those: turn 2's prompt is turn 1's, the sampled ids and the delta."""
    import math

    from turnkit.engine_client import EngineClient

    client = EngineClient(server.url, "vllm", model="smollm2", stop_ids=fmt.stop_ids, max_tokens=16, temperature=0)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    traj = fmt.trajectory(question)
    first = client.sample(traj)
    assert first.engine_prompt_ids == fmt.encode(question, add_generation_prompt=True).input_ids.tolist()
    assert first.ids == first.response["choices"][0]["token_ids"]
    delta = traj.add_messages([{"role": "user", "content": "And of Italy?"}])
    second = client.sample(traj)
    assert second.engine_prompt_ids == first.prompt_ids + first.ids + delta
    (row,) = traj.rows
    assert row.input_ids == second.prompt_ids + second.ids
    for sample in (first, second):
        stopped = sample.ids[-1] in fmt.stop_ids
        assert all(math.isfinite(value) for value in sample.logprobs[: len(sample.ids) - stopped])


def test_a_forced_call_comes_back_as_tool_calls_whole_and_streamed(server):
    """``tool_choice`` naming a function: vLLM's own forced call (the arguments' JSON, constrained), unchanged."""
    forced = {"type": "function", "function": {"name": "get_weather"}}
    whole, streamed = _whole_and_streamed(server, tools=TOOLS, tool_choice=forced)
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == [(call.function.name, call.function.arguments)]


def test_a_required_call_comes_back_as_tool_calls_whole_and_streamed(server):
    """``tool_choice: "required"``: vLLM's constraint (an array of calls) and vLLM's reader of that array, called by
    the plugin's parser with the stream's text kept (vLLM keeps none for parsers that stream from their own state):
    the official client's chunks assembled are the whole reply's calls, and both end as ``tool_calls``."""
    whole, streamed = _whole_and_streamed(server, tools=TOOLS, tool_choice="required", max_tokens=160)
    choice = whole.choices[0]
    calls = choice.message.tool_calls
    assert calls and {call.function.name for call in calls} == {"get_weather"}
    assert all(isinstance(json.loads(call.function.arguments), dict) for call in calls)
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == [
        (call.function.name, call.function.arguments) for call in calls
    ]
    assert all(c["id"] for c in streamed["calls"]) and streamed["finish"] == "tool_calls" and not streamed["content"]


def test_a_think_block_is_reasoning_whole_and_streamed(server):
    """The template's ``<think>`` block comes back as vLLM's ``reasoning`` field, the rest as content, whole and
    streamed identically (and with tools offered, the same)."""
    written = "<think>\nThe user greets me.\n</think>\n\nHello there!"
    constraint = {"structured_outputs": {"regex": _literal(written)}}
    for extra in ({}, {"tools": TOOLS, "tool_choice": "auto"}):
        whole, streamed = _whole_and_streamed(server, extra_body=constraint, **extra)
        message = whole.choices[0].message
        assert (message.model_extra["reasoning"], message.content) == ("The user greets me.", "Hello there!")
        assert (streamed["reasoning"], streamed["content"]) == ("The user greets me.", "Hello there!")
        assert not message.tool_calls and not streamed["calls"]


def _literal(text: str) -> str:
    """A regex that matches exactly ``text``."""
    import re

    return re.escape(text)


# -- the parsers in vLLM's own interfaces, in process ------------------------------------------------------------


class _Carrier:
    """The tokenizer vLLM hands a parser, standing for a model folder whose format is ``fmt`` (the peers' vectors
    name a format, not a checkpoint)."""

    def __init__(self, fmt: ChatFormat) -> None:
        self.turnkit_format = fmt
        self.name_or_path = "peer-vectors"
        self.all_special_tokens: list[str] = []

    def get_vocab(self) -> dict[str, int]:
        return {}


def _with_format(reply_format: Any, base: ChatFormat) -> ChatFormat:
    from turnkit.parse.choice.select import Choice

    fmt = ChatFormat.from_family("chatml", tokenizer=base.tokenizer.backend)
    fmt.__dict__["reply_choice"] = Choice(reply_format, {})
    return fmt


def _plugin_reply(fmt: ChatFormat, chunks: list[str], *, streamed: bool) -> tuple[Reply, bool]:
    """The reply as the plugin's parsers give it to vLLM, and whether vLLM reports calls (``tools_called``): whole,
    the reasoning parser's split then the tool parser's calls; streamed, the tool parser fed each chunk's ids and
    flushed, the deltas folded (vLLM reports the calls it streamed)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from turnkit.vllm_plugin.parsers import TurnkitReasoningParser, TurnkitToolParser

    carrier = _Carrier(fmt)
    tools = TurnkitToolParser(carrier)
    # The vectors do not hold the tools their tests offered: the tool parser reads without schemas, as
    # tests/parse_peers.py does, and the reasoning parser is told that tools are offered (so it hands the text on).
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tool_choice="none")
    offered = ChatCompletionRequest(model="m", messages=request.messages, tools=TOOLS, tool_choice="auto")
    if not streamed:
        reasoning, rest = TurnkitReasoningParser(carrier).extract_reasoning("".join(chunks), offered)
        info = tools.extract_tool_calls(rest or "", request)
        calls = [ParsedToolCall(c.id, c.function.name, c.function.arguments) for c in info.tool_calls]
        return Reply(info.content or "", reasoning, calls), info.tools_called
    deltas = []
    for chunk in chunks:
        ids = fmt.tokenizer.backend.encode(chunk, add_special_tokens=False).ids
        deltas.append(tools.extract_tool_calls_streaming("", "", chunk, [], [], ids, request))
    deltas.append(tools.finish_streaming())
    content = "".join(d.content or "" for d in deltas if d)
    reasoning = "".join(d.reasoning or "" for d in deltas if d) or None
    calls_by_index: dict[int, list[str]] = {}
    for delta in (d for d in deltas if d):
        for piece in delta.tool_calls:
            entry = calls_by_index.setdefault(piece.index, [piece.id or "", "", ""])
            entry[1] += piece.function.name or "" if piece.function else ""
            entry[2] += piece.function.arguments or "" if piece.function else ""
    folded = [ParsedToolCall(i, n, a) for i, n, a in calls_by_index.values()]
    return Reply(content, reasoning, folded), bool(folded)


def test_forced_calls_stream_as_they_read_whole_through_vllms_composed_parser(fmt):
    """vLLM's own composition of the two parsers (``ParserManager``'s ``DelegatingParser``), in process: a
    ``required`` array of two calls and a named call's arguments, fed three characters a delta as vLLM's server feeds
    a stream, assemble to the calls the whole reply gives (the arguments as written), with vLLM's constraint set on
    the request."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    register()
    composed = ParserManager.get_parser(tool_parser_name=MODE, reasoning_parser_name=MODE, enable_auto_tools=True)
    assert composed is not None
    required = '[{"name": "get_weather", "parameters": {"city":  "Paris"}}, {"name": "get_weather", "parameters": {}}]'
    named = {"type": "function", "function": {"name": "get_weather"}}
    for tool_choice, text in (("required", required), (named, '{"city": "Rome"}')):
        request = ChatCompletionRequest(model="m", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice)
        request = composed(_Carrier(fmt), request.tools).adjust_request(request)
        assert request.structured_outputs is not None and request.structured_outputs.json is not None
        _reasoning, content, whole = composed(_Carrier(fmt), request.tools).parse(text, request, enable_auto_tools=True)
        assert content is None and whole
        stream = composed(_Carrier(fmt), request.tools)
        pieces = [text[n : n + 3] for n in range(0, len(text), 3)]
        calls: dict[int, list[str]] = {}
        for n, piece in enumerate(pieces):
            delta = stream.parse_delta(piece, [0], request, prompt_token_ids=[0], finished=n == len(pieces) - 1)
            assert delta is None or not delta.content
            for call in delta.tool_calls if delta is not None else []:
                entry = calls.setdefault(call.index, ["", ""])
                entry[0] += call.function.name or ""
                entry[1] += call.function.arguments or ""
        assert [tuple(entry) for entry in calls.values()] == [(call.name, call.arguments) for call in whole]
    assert [call.arguments for call in whole] == ['{"city": "Rome"}']


def _shown(reply: Reply) -> tuple[Any, ...]:
    return reply.content, reply.reasoning_content, [(c.name, c.arguments) for c in reply.tool_calls]


def test_the_peers_tool_cases_read_through_the_plugins_parsers_as_turnkit_reads_them(fmt):
    """vLLM's 401 tool-parser cases (../shared/conformance/peers) through the plugin's parser objects in vLLM's
    interface: each whole reply passes or differs exactly as turnkit's own reading does in
    tests/parse/test_parse_peers.py (docs/guides/parsing.md's table), so the plugin adds no difference of its own, and
    the streamed reply (ids fed chunk by chunk) shows the same content, reasoning and calls."""
    own = {r.case: r for r in LOADERS["vllm_tool"]()}
    data = _json("vllm_tool_parser_cases.json")
    formats: dict[str, ChatFormat] = {}
    mismatched = []
    for n, case in enumerate(data["cases"]):
        key = VLLM_PARSERS[case["parser"]]
        name = f"{key}#{n}"
        # tests/parse_peers.py reads a tool parser's case as a reply whose prompt opened no reasoning
        plugin_fmt = formats.setdefault(key, _with_format(_unprefilled(catalog.get(key)), fmt))
        chunks = case.get("deltas") or [case["model_output"]]
        reply, called = _plugin_reply(plugin_fmt, chunks, streamed=False)
        problems = (
            _vllm_calls_match(reply, case["expected_tool_calls"]) if case["expected_tool_calls"] is not None else []
        )
        if case.get("expected_num_tool_calls") is not None and len(reply.tool_calls) != case["expected_num_tool_calls"]:
            problems.append(f"{len(reply.tool_calls)} calls")
        if case.get("expected_tools_called") is not None and called != case["expected_tools_called"]:
            problems.append(f"tools_called {called}")
        if case["content_asserted"] and reply.content.strip() != (case["expected_content"] or "").strip():
            problems.append(f"content {reply.content!r}")
        if (not problems) != own[name].ok:
            mismatched.append(f"{name}: plugin {problems or 'passes'}; turnkit {own[name].detail or 'passes'}")
        streamed, _ = _plugin_reply(plugin_fmt, chunks, streamed=True)
        if _shown(streamed) != _shown(reply):
            mismatched.append(f"{name}: streamed {_shown(streamed)} != whole {_shown(reply)}")
    assert not mismatched, "\n".join(mismatched[:10])


def _unprefilled(reply_format: Any) -> Any:
    from dataclasses import replace

    if reply_format.reasoning is None or not reply_format.reasoning.prefilled:
        return reply_format
    return replace(reply_format, reasoning=replace(reply_format.reasoning, prefilled=False))


def test_the_peers_reasoning_cases_read_through_the_plugins_parsers_as_turnkit_reads_them(fmt):
    """vLLM's whole-reply reasoning cases through the plugin's parsers: the same pass or stated difference as
    turnkit's own reading (the single-step and prompt cases test vLLM's streaming state, which the plugin leaves to
    its tool parser)."""
    own: dict[str, Result] = {r.case: r for r in LOADERS["vllm_reasoning"]()}
    data = _json("vllm_reasoning_cases.json")
    mismatched, run = [], 0
    for n, case in enumerate(data["cases"]):
        key = case["parser"].split(" ")[0]
        reply_format = _vllm_reasoning_format(case["parser"])
        thinking = case.get("chat_template_kwargs")
        if case["kind"] in ("is_reasoning_end_prompt", "single_streaming_step") or reply_format.reasoning is None:
            continue
        if thinking or reply_format.reasoning.prefilled:
            continue  # the prompt opened reasoning: the plugin reads it from the ids of a served prompt
        run += 1
        plugin_fmt = _with_format(reply_format, fmt)
        chunks = case.get("deltas") or [case["output"]]
        reply, _ = _plugin_reply(plugin_fmt, chunks, streamed=False)
        want_r, want_c = case["expected_reasoning"], case["expected_content"]
        exact = reply.reasoning_content == want_r and (reply.content or None) == want_c
        if exact != own[f"{key}#{n}"].ok:
            mismatched.append(f"{key}#{n}: {reply.reasoning_content!r} {reply.content!r}; {own[f'{key}#{n}'].detail}")
        streamed, _ = _plugin_reply(plugin_fmt, chunks, streamed=True)
        if _shown(streamed) != _shown(reply):
            mismatched.append(f"{key}#{n}: streamed {_shown(streamed)} != whole {_shown(reply)}")
    assert run > 50
    assert not mismatched, "\n".join(mismatched[:10])


def test_chat_requests_stop_at_turnkits_end_of_turn_ids(fmt, model_folder):
    """Both parsers add the end-of-turn and EOS ids turnkit finds to a chat request's ``stop_token_ids``."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tokenizers.registry import get_tokenizer

    from turnkit.vllm_plugin.parsers import TurnkitReasoningParser, TurnkitToolParser

    tokenizer = get_tokenizer(str(model_folder))
    for parser in (TurnkitReasoningParser(tokenizer), TurnkitToolParser(tokenizer)):
        request = ChatCompletionRequest(model="m", messages=MESSAGES, tools=TOOLS, stop_token_ids=[7])
        adjusted = parser.adjust_request(request)
        assert adjusted.stop_token_ids == [7, *sorted(fmt.stop_ids)]
        assert fmt.stop_ids  # <|im_end|>'s id, found from the template


def test_a_template_whose_calls_nothing_reads_says_so_at_start(smollm2_hf_folder, tmp_path):
    """The format is announced when vLLM builds the renderer and parsers at start, in vLLM's own log: for a template
    whose tool calls no reading follows, an error line says its calls come back as content."""
    from turnkit.vllm_plugin.model import format_for

    folder = tmp_path / "unreadable"
    folder.mkdir()
    for source in smollm2_hf_folder.iterdir():
        if source.name != "chat_template.jinja":
            (folder / source.name).symlink_to(source)
    (folder / "chat_template.jinja").write_text(UNREADABLE, encoding="utf-8")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("vllm.turnkit")
    logger.addHandler(handler)
    try:
        format_for(str(folder))
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.levelno == logging.ERROR and "come back as content" in record.getMessage()


def test_a_tool_parser_alone_on_a_reasoning_template_is_refused_at_start(model_folder):
    """vLLM checks a parser against the tokenizer at start: the turnkit tool parser without the reasoning parser, on
    a template that writes reasoning, stops the start with a line naming the missing flag."""
    from vllm.parser.parser_manager import ParserManager
    from vllm.tokenizers.registry import get_tokenizer

    register()
    with pytest.raises(TypeError, match="add --reasoning-parser turnkit"):
        ParserManager.get_parser(
            tool_parser_name=MODE, enable_auto_tools=True, tokenizer=get_tokenizer(str(model_folder))
        )


# -- version bounds ------------------------------------------------------------------------------------------------


def test_the_installed_vllm_is_the_one_the_plugin_knows():
    assert vllm_release() in TESTED
    assert interface_problems(vllm_release()) == []


def test_an_unknown_vllm_is_named_in_one_line():
    """Another release, or vLLM's modules of another shape (a registry without ``register``, a module gone), are
    problems; the message names the tested and the installed release on one line."""
    import importlib

    class Moved:  # a renderer registry whose register was renamed
        RENDERER_REGISTRY = object()

    def shaped(name: str) -> Any:
        if name == "vllm.renderers.registry":
            return Moved
        if name == "vllm.parser.abstract_parser":
            raise ImportError(name)
        return importlib.import_module(name)

    problems = interface_problems("0.33.1", shaped)
    assert problems == [
        "vLLM 0.33.1 is not a tested release",
        "vllm.renderers.registry.RENDERER_REGISTRY.register is missing",
        "vllm.parser.abstract_parser is missing",
    ]
    message = mismatch_message("0.33.1", problems)
    assert "\n" not in message and "0.32.0" in message and "0.33.1" in message


def test_a_vllm_start_with_the_plugin_stops_on_an_unknown_vllm():
    """vLLM's plugin loader runs ``register`` in a process whose command line asks for turnkit: on an unknown
    release it exits 1 with the one line (here the release is changed in process: the interfaces are vLLM 0.32's)."""
    code = (
        "import sys, turnkit.vllm_plugin as plugin\n"
        "sys.argv = ['api_server', '--tokenizer-mode', 'turnkit']\n"
        "plugin.vllm_release = lambda: '0.40.0'\n"
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("turnkit: error:")]
    assert "tested with vLLM 0.32.0" in line and "this is vLLM 0.40.0" in line


# -- the plugin's flags as one set ----------------------------------------------------------------------------------

#: Command lines with part of the plugin's flags, and what the one line each stops with asks for.
PARTIAL_FLAGS = [
    (("--enable-auto-tool-choice", "--tool-call-parser", MODE, "--reasoning-parser", MODE), "add --tokenizer-mode"),
    (("--reasoning-parser=turnkit",), "add --tokenizer-mode turnkit"),
    (("--tokenizer-mode", MODE, "--enable-auto-tool-choice", "--tool_call_parser", MODE), "add --reasoning-parser"),
    (("--tokenizer-mode", MODE, "--reasoning-parser", MODE), "add --tool-call-parser turnkit"),
    (("--tokenizer-mode", MODE, "--tool-call-parser", MODE, "--reasoning-parser", MODE), "--enable-auto-tool-choice"),
    (
        ("--tokenizer-mode", MODE, "--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
        "give --tool-call-parser",
    ),
    ((*FLAGS, "--chat-template", "{{ messages }}"), "drop --chat-template"),
]


def test_read_flags_reads_vllms_spellings_and_its_config_file(tmp_path):
    """``--flag value``, ``--flag=value``, ``_`` for ``-``, and the keys of ``--config FILE.yaml`` under the command
    line's (vLLM's own merge order)."""
    from turnkit.vllm_plugin.flags import PluginFlags, flag_problem, read_flags

    config = tmp_path / "serve.yaml"
    config.write_text("tool-call-parser: turnkit\nreasoning_parser: turnkit\nenable-auto-tool-choice: true\n")
    flags = read_flags(["--model", "m", "--config", str(config), "--tokenizer_mode=turnkit"])
    assert flags == PluginFlags(MODE, MODE, MODE, True, None)
    assert flag_problem(flags) is None
    assert flag_problem(read_flags(["--config", str(config)])) is not None  # the parsers without the mode
    assert flag_problem(read_flags(["--tokenizer-mode", MODE])) is None  # prompts only: replies as text
    assert flag_problem(read_flags(["--tool-call-parser", "hermes", "--enable-auto-tool-choice"])) is None
    assert read_flags(["--tokenizer-mode", MODE, "--chat-template", "t.jinja"]).chat_template == "t.jinja"


def test_a_start_with_part_of_the_plugins_flags_stops_in_one_line(model_folder):
    """The parsers without ``--tokenizer-mode turnkit`` would read replies the turnkit way over prompts vLLM renders
    its own way (a forged turn real, the log saying "replies are read as ..."), so every partial set of the flags
    stops vLLM's real server at start, before it reads the model: exit 1, one line naming what to add, no traceback.
    The starts run side by side; each one's time is printed (it is vLLM's import: about 10 CPU seconds)."""

    def start(flags: tuple[str, ...]) -> tuple[subprocess.CompletedProcess[str], float]:
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_folder), *flags]
        began = time.monotonic()
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ))
        return result, time.monotonic() - began

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(start, [flags for flags, _ in PARTIAL_FLAGS]))
    for (flags, asks), (result, seconds) in zip(PARTIAL_FLAGS, runs, strict=True):
        print(f"{' '.join(flags)}: stopped in {seconds:.1f} s")
        assert result.returncode == 1, (flags, result.stderr[-2000:])
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("turnkit: error:")]
        assert asks in line, (flags, line)
        assert "Traceback" not in result.stderr and "Resolved architecture" not in result.stderr + result.stdout
