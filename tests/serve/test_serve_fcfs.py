"""An oversubscribed server, first come first served (issue 39): many streams with long prompts sent at once to the
real embedded model on the llama.cpp engine. Every request either finishes or is refused before its status line;
the admitted ones get their first tokens in the order they arrived (the prefill budget goes to the oldest first); and
every stream that waits for its first token hears a keep-alive in each silence (an SSE comment on the OpenAI APIs, a
``ping`` event on the Messages API), so a client's read timeout never gives up on a request about to be answered.

The keep-alive interval (15 s in a server) is shortened to 0.4 s here, through the SSE writer's setting.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from dataclasses import dataclass, field

import anthropic
import httpx
import openai
import pytest
from serve_harness import serving

from turnkit.serve.app import sse
from turnkit.serve.app.routes import Server
from turnkit.serve.engines import EngineOptions
from turnkit.serve.models import ModelRegistry
from turnkit.serve.modelspec import ModelSpec

MODEL = "SmolLM2-135M-Instruct"
KEEP_ALIVE = 0.4
#: Slots and queue places: of the streams sent, SLOTS + QUEUE are admitted (some after waiting), the rest refused.
SLOTS, QUEUE, STREAMS = 3, 2, 7


@pytest.fixture(scope="module")
def base_url(smollm2_gguf):
    options = EngineOptions(threads=1, prefill_threads=1, max_batch=SLOTS, max_queue=QUEUE)
    registry = ModelRegistry([ModelSpec(MODEL, "default")], options=options)
    registry.preload(MODEL)
    server = Server(registry)
    try:
        with serving(server.app()) as url:
            yield url
    finally:
        registry.close()


@pytest.fixture(autouse=True)
def short_keep_alive(monkeypatch):
    monkeypatch.setattr(sse, "KEEP_ALIVE_SECONDS", KEEP_ALIVE)


def _question(n: int) -> str:
    """A long prompt of its own (about 170 tokens): no stream reuses another's prefix past the template's."""
    rows = " ".join(f"{n}-{i}:{(n * 31 + i * 17) % 997}" for i in range(40))
    return f"Log {n}. Which value is the largest? {rows}"


@dataclass
class Stream:
    status: int = 0
    headers_at: float = 0.0
    first_token_at: float | None = None
    lines: list[tuple[float, str]] = field(default_factory=list)
    finish: str | None = None
    done: bool = False


async def _chat(client: httpx.AsyncClient, n: int, stream: Stream) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": _question(n)}],
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        stream.status, stream.headers_at = response.status_code, time.monotonic()
        if response.status_code != 200:
            await response.aread()
            return
        async for line in response.aiter_lines():
            now = time.monotonic()
            if not line:
                continue
            stream.lines.append((now, line))
            if line == "data: [DONE]":
                stream.done = True
            elif line.startswith("data: "):
                choice = (json.loads(line[6:])["choices"] or [{}])[0]
                delta = choice.get("delta", {})
                if stream.first_token_at is None and ("content" in delta or choice.get("finish_reason")):
                    stream.first_token_at = now
                stream.finish = choice.get("finish_reason") or stream.finish


async def _counted(client: httpx.AsyncClient) -> int:
    health = (await client.get("/health")).json()
    return health["generating"] + health["waiting"]


def test_oversubscribed_streams_are_answered_in_arrival_order_with_keep_alives(base_url):
    """Seven streams for three slots and two queue places, each sent once the server counted the one before (so the
    arrival order is known): two are refused with 429 before any byte, five get a 200, and all five finish; their
    first tokens come in arrival order (within a step: two prompts finished by the same step may be delivered in
    either order), and no stream is silent longer than the keep-alive interval (plus scheduling slack) before its
    first token."""
    streams = [Stream() for _ in range(STREAMS)]

    async def main() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            tasks = []
            for n, stream in enumerate(streams):
                before = await _counted(client)
                task = asyncio.create_task(_chat(client, n, stream))
                tasks.append(task)
                deadline = time.monotonic() + 30
                while not task.done() and await _counted(client) <= before and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            await asyncio.gather(*tasks)

    asyncio.run(main())
    admitted = [stream for stream in streams if stream.status == 200]
    refused = [stream for stream in streams if stream.status != 200]
    assert len(admitted) == SLOTS + QUEUE and all(stream.status == 429 for stream in refused), [
        s.status for s in streams
    ]
    for n, stream in enumerate(admitted):
        assert stream.done and stream.finish in ("stop", "length"), (n, stream.lines[-3:])
        assert stream.first_token_at is not None
    # A step's time on this machine now (busy or not): the median gap between the admitted streams' later tokens.
    # Two first tokens may come a step apart either way; a stream served out of turn comes a whole prompt's prefill
    # (many steps) late.
    step = statistics.median(
        b - a
        for stream in admitted
        for a, b in itertools.pairwise([at for at, line in stream.lines if at >= stream.first_token_at])
    )
    slack = max(0.25, 2 * step)
    firsts = [stream.first_token_at for stream in admitted]
    for n in range(len(firsts) - 1):
        assert firsts[n] <= firsts[n + 1] + slack, (
            f"stream {n}'s first token came after stream {n + 1}'s: {firsts} (a step {step:.2f} s)"
        )
    # a stream admitted at once waited seconds behind the prompts ahead of it; every silence was broken by a keep-alive
    waited = max(admitted, key=lambda stream: stream.first_token_at - stream.headers_at)  # type: ignore[operator]
    assert waited.first_token_at - waited.headers_at > 3 * KEEP_ALIVE  # type: ignore[operator]
    for n, stream in enumerate(admitted):
        times = [stream.headers_at] + [at for at, _ in stream.lines if at <= stream.first_token_at]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert max(gaps) < KEEP_ALIVE + max(0.6, 2 * step), (n, max(gaps), step)
    assert any(line == ": keep-alive" for _, line in waited.lines), waited.lines[:5]


def test_official_clients_skip_keep_alives(base_url):
    """Two streams wait while a long prompt ahead of them is prefilled: the Messages API sends ``ping`` events (the
    raw stream has more than the one after ``message_start``), a chat stream ``: keep-alive`` comments; then, waiting
    the same way, Anthropic's and OpenAI's clients read their replies through them."""
    blocker = {"model": MODEL, "messages": [{"role": "user", "content": _question(100) * 2}], "max_tokens": 2}

    def claude() -> anthropic.AsyncAnthropic:  # one per event loop: a client's connections belong to its loop
        return anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0)

    def gpt() -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)

    async def raw_pings() -> list[str]:
        async with claude().messages.with_streaming_response.create(
            model=MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": "Say hello 101."}]
        ) as raw:
            return [line async for line in raw.iter_lines()]

    async def raw_comments() -> list[str]:
        async with gpt().chat.completions.with_streaming_response.create(
            model=MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": "Say hello 102."}]
        ) as raw:
            return [line async for line in raw.iter_lines()]

    async def claude_text() -> str:
        events = await claude().messages.create(
            model=MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": "Say hello 103."}]
        )
        return "".join([e.delta.text async for e in events if e.type == "content_block_delta"])  # type: ignore[union-attr]

    async def gpt_text() -> str:
        chunks = await gpt().chat.completions.create(
            model=MODEL, max_tokens=3, stream=True, messages=[{"role": "user", "content": "Say hello 104."}]
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    async def behind_a_long_prompt(*calls):
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            first = asyncio.create_task(client.post("/v1/chat/completions", json=blocker))
            while await _counted(client) < 1:
                await asyncio.sleep(0.005)
            results = await asyncio.gather(*(call() for call in calls))
            assert (await first).status_code == 200
            return results

    ping_lines, comment_lines = asyncio.run(behind_a_long_prompt(raw_pings, raw_comments))
    assert ping_lines.count("event: ping") >= 2, ping_lines[:8]
    assert "event: message_stop" in ping_lines
    assert ": keep-alive" in comment_lines and "data: [DONE]" in comment_lines
    text, reply = asyncio.run(behind_a_long_prompt(claude_text, gpt_text))
    assert text.strip() and reply.strip()
