"""``--tool-call-parser turnkit`` and ``--reasoning-parser turnkit``: replies read by the format of the template.

vLLM reads tool calls and reasoning with a parser the operator names per model; a wrong name gives silent garbage.
These two read every reply with the reply format turnkit chose by rendering the checkpoint's own template
(:attr:`turnkit.ChatFormat.reply_format`), the parser ``turnkit serve`` runs: a whole reply with ``fmt.parse``, a
streamed one with ``fmt.stream_parser`` fed the sampled ids, so a marker counts only as its token.

vLLM composes the two into its ``DelegatingParser``, which asks the reasoning parser first and hands what it
returns as content to the tool parser. turnkit reads reasoning and calls in one pass, so:

* a streamed reply is read whole by the tool parser (vLLM streams its ``reasoning``, ``content`` and
  ``tool_calls``): the reasoning parser tells vLLM that reasoning never stays open from the prompt
  (``is_reasoning_end``), which also lets a grammar (``response_format``, a forced call) apply from the first token;
* a whole reply: the reasoning parser reports its reasoning and hands the text on to the tool parser where the tool
  parser will read it (tools offered and not ``tool_choice: "none"``); elsewhere it hands on turnkit's content.

Forced calls (``tool_choice`` naming a function, or ``required``) are decoded under vLLM's own constraint (the
arguments' JSON; for ``required`` an array of ``{"name", "parameters"}`` objects) and read by vLLM's own readers of
that JSON (``vllm.tool_parsers.streaming``), but called from here: vLLM's ``DelegatingParser`` reads a streamed
``required`` array from the text accumulated so far, and it keeps no text for parsers that stream from their own
state (``engine_based_streaming``, as these do: ``StreamState.advance`` hands them each delta alone), so the array
would never parse and the calls would be lost. The tool parser therefore says it does not read forced calls as JSON
(``supports_required_and_named = False``, which makes vLLM hand them to it as to an ``auto`` reply), sets vLLM's
constraint itself and keeps the text of a ``required`` stream. A call's arguments are the text the model wrote, whole
and streamed alike.

Both parsers add the end-of-turn and EOS ids turnkit finds to the request's ``stop_token_ids`` (``adjust_request``),
so a chat reply ends where the template ends a turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.reasoning.abs_reasoning_parsers import ReasoningParser
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.streaming import extract_named_tool_call_streaming, extract_required_tool_call_streaming

from turnkit.format import ChatFormat
from turnkit.parse import CallStatus, Delta, StreamParser
from turnkit.vllm_plugin.model import format_of_tokenizer

__all__ = ["TurnkitReasoningParser", "TurnkitToolParser", "delta_message"]


def delta_message(deltas: Sequence[Delta]) -> DeltaMessage | None:
    """turnkit's deltas as one vLLM ``DeltaMessage`` (None when they hold nothing): the texts joined, the pieces of
    one tool call merged."""
    content = "".join(d.content for d in deltas if d.content is not None)
    reasoning = "".join(d.reasoning_content for d in deltas if d.reasoning_content is not None)
    calls: dict[int, DeltaToolCall] = {}
    for delta in deltas:
        for piece in delta.tool_calls:
            call = calls.get(piece.index)
            if call is None:
                calls[piece.index] = DeltaToolCall(
                    index=piece.index,
                    id=piece.id,
                    type="function" if piece.id is not None else None,
                    function=DeltaFunctionCall(name=piece.name, arguments=piece.arguments),
                )
                continue
            assert call.function is not None
            if piece.id is not None:
                call.id, call.type = piece.id, "function"
            if piece.name is not None:
                call.function.name = piece.name
            call.function.arguments = (call.function.arguments or "") + piece.arguments
    if not content and not reasoning and not calls:
        return None
    return DeltaMessage(content=content or None, reasoning=reasoning or None, tool_calls=list(calls.values()))


def _tools(request: Any) -> list[dict[str, Any]] | None:
    """The tools a request offers, as the schemas turnkit reads (their parameters type raw argument values)."""
    tools = getattr(request, "tools", None)
    if not tools:
        return None
    return [tool.model_dump(exclude_none=True) if hasattr(tool, "model_dump") else dict(tool) for tool in tools]


def _adjusted(fmt: ChatFormat, tokenizer: Any, request: Any) -> Any:
    """The request with turnkit's stop ids added, and special tokens kept in the text where the reply format's
    markers are special tokens (a whole reply is read from that text)."""
    if hasattr(request, "stop_token_ids"):
        request.stop_token_ids = list(dict.fromkeys([*(request.stop_token_ids or []), *sorted(fmt.stop_ids)]))
    specials = [token for token in getattr(tokenizer, "all_special_tokens", ()) if token]
    markers = fmt.reply_format.markers
    if any(special in marker for marker in markers for special in specials):
        request.skip_special_tokens = False
    return request


def _forced_name(request: Any) -> str | None:
    """The function a request's ``tool_choice`` names (Chat Completions' ``{"function": {"name"}}``, the Responses
    API's ``{"name"}``), or None."""
    choice = getattr(request, "tool_choice", None)
    if choice is None or isinstance(choice, str):
        return None
    function = getattr(choice, "function", None)
    name = getattr(function, "name", None) if function is not None else getattr(choice, "name", None)
    return name if isinstance(name, str) else None


class _ForcedAsJson:
    """The parser ``ToolParser.adjust_request`` sets vLLM's forced-call constraint for (the arguments' JSON, or the
    array of calls for ``required``): that method reads only this flag of its parser, so calling it with this
    stand-in gives turnkit's parser, which takes the flag down to read forced calls itself, vLLM's own constraint."""

    supports_required_and_named = True


class TurnkitToolParser(ToolParser):  # type: ignore[misc]  # vLLM is untyped where mypy runs
    """Reads tool calls, content and reasoning with the template's reply format: a whole reply from its text, a
    streamed one from its ids; a forced call (decoded as vLLM's JSON) with vLLM's readers of that JSON."""

    engine_based_streaming = True
    #: vLLM hands forced calls to this parser (see the module's docstring: its own reading of a streamed
    #: ``required`` array needs text vLLM does not keep for this parser)
    supports_required_and_named = False

    def __init__(self, tokenizer: Any, tools: list[Any] | None = None) -> None:
        super().__init__(tokenizer, tools)
        self.format = format_of_tokenizer(tokenizer)
        self._stream: StreamParser | None = None
        self._alone = False
        self._forced_text = ""  # a streamed ``required`` array so far
        self._named_sent = False  # a streamed named call: its id and name are out

    @property
    def skip_reasoning_parsing(self) -> bool:
        """Set by vLLM when no reasoning parser is configured: a template that writes reasoning needs both."""
        return self._alone

    @skip_reasoning_parsing.setter
    def skip_reasoning_parsing(self, alone: bool) -> None:
        reasoning = self.format.reply_format.reasoning
        if alone and reasoning is not None:
            raise TypeError(
                f"the template writes reasoning ({reasoning.start}...{reasoning.end}), which turnkit reads together "
                "with the tool calls: add --reasoning-parser turnkit"
            )
        self._alone = alone

    def adjust_request(self, request: Any) -> Any:
        return _adjusted(self.format, self.model_tokenizer, ToolParser.adjust_request(_ForcedAsJson(), request))

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        if getattr(request, "tool_choice", None) == "required" or _forced_name(request) is not None:
            return self._forced_calls(model_output, request)
        reply = self.format.parse(model_output, tools=_tools(request))
        calls = [
            ToolCall(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))
            for call in reply.tool_calls
        ]
        # every call is kept (streamed, a call is sent before it can fail); vLLM reports calls when one parsed
        called = any(call.status == CallStatus.OK for call in reply.tool_calls)
        return ExtractedToolCallInformation(tools_called=called, tool_calls=calls, content=reply.content or None)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> DeltaMessage | None:
        name = _forced_name(request)
        if name is not None:
            message, self._named_sent = extract_named_tool_call_streaming(
                delta_text=delta_text,
                function_name=name,
                function_name_returned=self._named_sent,
                tool_call_idx=None,
                tool_call_id_type="random",
                tokenizer=self.model_tokenizer,
            )
            return message
        if getattr(request, "tool_choice", None) == "required":
            sent, self._forced_text = self._forced_text, self._forced_text + delta_text
            message, _ = extract_required_tool_call_streaming(
                previous_text=sent, current_text=self._forced_text, tool_call_idx=None, tool_call_id_type="random"
            )
            return message
        if self._stream is None:
            self._stream = self.format.stream_parser(tools=_tools(request))
        return delta_message(self._stream.feed(list(delta_token_ids)))

    def _forced_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        """A forced reply's calls, read as its stream is (the same reader over the whole text), so the calls whole
        are the streamed ones assembled: a named call's arguments are the reply; ``required``'s are each element's
        ``parameters`` as written."""
        name = _forced_name(request)
        if name is not None:
            calls = [ToolCall(function=FunctionCall(name=name, arguments=model_output))] if model_output.strip() else []
        else:
            message, _ = extract_required_tool_call_streaming(
                previous_text="", current_text=model_output, tool_call_idx=None, tool_call_id_type="random"
            )
            pieces = message.tool_calls if message is not None else []
            read = [(piece.id, piece.function) for piece in pieces if piece.function is not None]
            calls = [
                ToolCall(id=id_, function=FunctionCall(name=function.name, arguments=function.arguments or ""))
                for id_, function in read
                if function.name
            ]
        return ExtractedToolCallInformation(tools_called=bool(calls), tool_calls=calls, content=None)

    def finish_streaming(self) -> DeltaMessage | None:
        """What the parser held back (a possible marker's start) once the stream ends; vLLM calls it last."""
        if self._stream is None or self._stream.ended:
            return None
        self._stream.finish()
        return delta_message(self._stream.final_deltas)


class TurnkitReasoningParser(ReasoningParser):  # type: ignore[misc]  # vLLM is untyped where mypy runs
    """Reports a whole reply's reasoning as the template's reply format reads it; a streamed reply's reasoning comes
    from :class:`TurnkitToolParser`, which reads the whole stream."""

    engine_based_streaming = True

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.format = format_of_tokenizer(tokenizer)

    @property
    def reasoning_start_str(self) -> str | None:
        reasoning = self.format.reply_format.reasoning
        return reasoning.start if reasoning is not None else None

    @property
    def reasoning_end_str(self) -> str | None:
        reasoning = self.format.reply_format.reasoning
        return reasoning.end if reasoning is not None else None

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Always: the tool parser reads a stream's reasoning with the rest, so vLLM starts every stream there."""
        return True

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return list(input_ids)

    def adjust_request(self, request: Any) -> Any:
        return _adjusted(self.format, self.model_tokenizer, request)

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        reply = self.format.parse(model_output, tools=_tools(request))
        read_on = bool(getattr(request, "tools", None)) and getattr(request, "tool_choice", None) != "none"
        return reply.reasoning_content, (model_output if read_on else reply.content) or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        """Not reached (:meth:`is_reasoning_end` ends reasoning before the first token); text passes on as content."""
        return DeltaMessage(content=delta_text) if delta_text else None
