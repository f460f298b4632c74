"""``/tokenize`` and ``/detokenize`` (vLLM's endpoints): their fields and requests. A chat input is read as chat
completions read it, so that the very body a client will send counts as it will be sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnkit.errors import APIError
from turnkit.serve.protocol.chat_input import CHAT_INPUT_FIELDS, read_chat_input
from turnkit.serve.protocol.fields import Fields, is_token_ids, read_field
from turnkit.serve.protocol.requests import ChatInput
from turnkit.serve.protocol.sampling_fields import SAMPLING_FIELDS

__all__ = [
    "DETOKENIZE_FIELDS",
    "TOKENIZE_FIELDS",
    "DetokenizeRequest",
    "TokenizeRequest",
    "parse_detokenize",
    "parse_tokenize",
]


@dataclass
class TokenizeRequest:
    """``/tokenize``: a raw ``prompt``, or ``chat_input`` rendered as chat completions would render it."""

    model: str | None
    prompt: str | None = None
    chat_input: ChatInput | None = None
    add_generation_prompt: bool = True


@dataclass
class DetokenizeRequest:
    model: str | None
    tokens: list[int] = field(default_factory=list)


#: ``/tokenize`` (vLLM's): a raw ``prompt``, or a chat input read as chat completions read it. The rest of a chat or
#: completions body is taken without effect, so that the very body a client will send counts as it will be sent.
TOKENIZE_FIELDS = Fields(
    "/tokenize",
    CHAT_INPUT_FIELDS | {"model", "prompt"},
    without_effect=(SAMPLING_FIELDS - CHAT_INPUT_FIELDS - {"model"})
    | {"max_completion_tokens", "logprobs", "top_logprobs", "response_format", "echo", "user", "metadata", "store"},
)
#: ``/detokenize``.
DETOKENIZE_FIELDS = Fields("/detokenize", frozenset({"model", "tokens"}))


def parse_tokenize(body: dict[str, Any]) -> TokenizeRequest:
    TOKENIZE_FIELDS.check(body)
    model = read_field(body, "model", str)
    add_generation_prompt = read_field(body, "add_generation_prompt", bool, not body.get("continue_final_message"))
    if "messages" in body:
        return TokenizeRequest(model, chat_input=read_chat_input(body), add_generation_prompt=add_generation_prompt)
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise APIError(400, "give 'prompt' (a string) or 'messages' (a list of messages)", param="prompt")
    return TokenizeRequest(model, prompt=prompt)


def parse_detokenize(body: dict[str, Any]) -> DetokenizeRequest:
    DETOKENIZE_FIELDS.check(body)
    tokens = body.get("tokens")
    if not is_token_ids(tokens):
        raise APIError(400, "tokens must be a list of token ids", param="tokens")
    return DetokenizeRequest(read_field(body, "model", str), tokens)
