"""The server's web page at ``/``: a chat playground that shows the exact tokens the model received.

A person who opens the server in a browser gets a small chat client (model picker from ``/v1/models``, system prompt,
messages, sampling fields, a streamed reply and a stop button) that talks to the same OpenAI endpoints as any client.
Its token view shows the prompt of the last request as token chips, the same chips as ``turnkit inspect``: the ids
come from ``POST /tokenize`` (what the chat endpoint encodes), so a user can see that a forged ``<|im_end|>`` stayed
text. The reply's tokens come from the stream's log-probabilities (each carries one generated token's bytes).

Plain HTML, CSS and script from package data, inlined into one page: no build step, no external assets, works
offline. ``pages`` is the whole hook into the router; ``turnkit serve --no-ui`` leaves it out.

``POST /ui/tokens`` turns ids (or a reply's token bytes) into chip pieces: ``{"tokens": [ids]}`` or
``{"bytes": [[...], ...]}``, with optional ``messages`` to attribute a prompt's tokens (origin, message index), as
``turnkit inspect`` does, when encoding those messages gives exactly those ids.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from turnkit.errors import TurnkitError
from turnkit.format import ChatFormat
from turnkit.inspect.render import asset, stand_ins_attribute
from turnkit.inspect.tokens import TokenTexts, find_forged_markers, sequence_segments
from turnkit.serve.app.body import read_body
from turnkit.serve.protocol import APIError

__all__ = ["PUBLIC_PATHS", "page_html", "pages"]

Handler = Callable[[Request], Awaitable[Response]]

#: Paths an API key does not guard: the page itself holds no data (a browser cannot send a bearer token when it
#: navigates); every request the page makes carries the key the user types.
PUBLIC_PATHS = frozenset({"/"})

_MAX_TOKENS = 1 << 20


@cache
def page_html() -> str:
    """The playground page: its HTML with the chip CSS and script, and its own, inlined."""
    own = resources.files("turnkit.serve.app") / "assets"
    html = (own / "playground.html").read_text(encoding="utf-8")
    return (
        html.replace("{{css}}", asset("chips.css") + (own / "playground.css").read_text(encoding="utf-8"))
        .replace("{{body}}", stand_ins_attribute())
        .replace("{{script}}", asset("chips.js") + (own / "playground.js").read_text(encoding="utf-8"))
    )


def _ids(body: dict[str, Any], texts: TokenTexts, size: int) -> list[int]:
    if "bytes" in body:
        raw = body["bytes"]
        if not isinstance(raw, list) or not all(isinstance(b, list) for b in raw):
            raise APIError(400, "bytes must be a list of byte lists (a reply's logprobs[].bytes)", param="bytes")
        ids = []
        for n, token in enumerate(raw):
            try:
                found = texts.id_of_bytes(bytes(token))
            except (TypeError, ValueError):
                raise APIError(400, f"bytes[{n}] must hold numbers from 0 to 255", param=f"bytes[{n}]") from None
            if found is None:
                raise APIError(400, f"bytes[{n}] are not the bytes of any one token", param=f"bytes[{n}]")
            ids.append(found)
        return ids
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise APIError(400, "give tokens (a list of token ids) or bytes", param="tokens")
    if len(tokens) > _MAX_TOKENS or any(not 0 <= t < size for t in tokens):
        raise APIError(400, f"token ids must be between 0 and {size - 1}", param="tokens")
    return tokens


def _attribution(fmt: ChatFormat, messages: Any, ids: list[int]) -> tuple[list[str], list[int], list[str]] | None:
    """Origin, message index and role per token, when encoding ``messages`` as the chat endpoint does gives ``ids``."""
    try:
        encoding = fmt.encode(messages, add_generation_prompt=True, turns="none")
    except TurnkitError:
        return None
    if isinstance(encoding, list) or encoding.input_ids.tolist() != ids:
        return None
    roles = [str(m.get("role", "")) if isinstance(m, dict) else "" for m in messages]
    index = encoding.message_index.tolist()
    origin = ["data" if d else "template" for d in encoding.is_data.tolist()]
    return origin, index, [roles[i] if 0 <= i < len(roles) else "" for i in index]


def pages(fmt: ChatFormat) -> list[tuple[str, str, Handler]]:
    """``(path, method, handler)`` of the page at ``/`` and of ``POST /ui/tokens``, for a server of ``fmt``; the
    router wraps each handler as it wraps its own (errors become OpenAI error objects)."""
    texts = TokenTexts(fmt.tokenizer, fmt.stops)
    size = fmt.tokenizer.backend.get_vocab_size(with_added_tokens=True)

    async def index(request: Request) -> Response:
        return HTMLResponse(page_html(), headers={"Cache-Control": "no-cache"})

    async def tokens(request: Request) -> Response:
        body = await read_body(request)
        ids = _ids(body, texts, size)
        found_pieces = texts.pieces(ids)
        markers = find_forged_markers(found_pieces, texts.binding)
        forged = {n for marker in markers for n in range(marker.start, marker.end)}
        shown = sequence_segments(found_pieces)
        pieces = [piece.to_dict(shown[n]) for n, piece in enumerate(found_pieces)]
        messages = body.get("messages")
        found = _attribution(fmt, messages, ids) if isinstance(messages, list) else None
        for n, piece in enumerate(pieces):
            if piece["control"]:
                piece["origin"] = "control"
            elif found is not None:
                piece["origin"] = found[0][n]
            else:
                piece["origin"] = "text"
            piece["message"] = found[1][n] if found else -1
            piece["role"] = found[2][n] if found else ""
            piece["forged"] = n in forged
        return JSONResponse({"tokens": pieces, "attributed": found is not None})

    return [("/", "GET", index), ("/ui/tokens", "POST", tokens)]
