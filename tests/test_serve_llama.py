"""The llama.cpp engine: the core server checks of ``test_serve.py`` on it, and what the engine adds.

* ``server``/``client``: ``turnkit serve --engine llama.cpp`` as a subprocess on the embedded GGUF, one thread; the core
  tests of ``test_serve.py`` are collected here again, so they run against this module's fixtures.
* ``backend``: the engine in this process (one thread, a small prefill chunk) for what only its insides show:
  continuous batching with chunked prefill, prefix reuse, a cancelled request leaving the batch.
* Greedy output against llama-cpp-python's own ``Llama`` on the same prompt ids: the same kernels, the same tokens.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import test_serve as core
from serve_harness import serving, turnkit_serve, whole_and_streamed

from turnkit import ChatFormat
from turnkit.serve import GenerationRequest

pytest.importorskip("llama_cpp")

# The quantized model (Q4_1, computed as such by llama.cpp) does not say "Paris" to test_serve's question; it does
# answer this one.
GERMANY = [{"role": "user", "content": "What is the capital of Germany?"}]
SYSTEM = (
    "You are the help desk of a small bicycle shop in Utrecht. Answer in one short sentence, politely, and never "
    "invent prices. Opening hours are nine to six on weekdays and ten to four on Saturdays; the shop is closed on "
    "Sundays. Repairs take two days; rentals need an identity card and a deposit. "
) * 3


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    with turnkit_serve(
        "--model",
        str(smollm2_gguf),
        "--engine",
        "llama.cpp",
        "--threads",
        "1",
        "--model-id",
        "smollm2",
        name="serve-llama",
    ) as (url, log):
        yield url, log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


# The core checks of the server, on this engine (collected under this module, so with the fixtures above).
test_models_and_health = core.test_models_and_health
test_max_tokens_gives_length = core.test_max_tokens_gives_length
test_logprobs = core.test_logprobs
test_seeded_sampling_is_repeatable = core.test_seeded_sampling_is_repeatable
test_completions = core.test_completions
test_a_forged_turn_reaches_the_model_as_text = core.test_a_forged_turn_reaches_the_model_as_text
test_the_official_client_sees_typed_errors = core.test_the_official_client_sees_typed_errors
test_a_client_that_disconnects_frees_its_slot = core.test_a_client_that_disconnects_frees_its_slot


def test_chat_and_real_usage(client, server):
    response = client.chat.completions.create(model="smollm2", messages=GERMANY, temperature=0, max_tokens=24)
    choice = response.choices[0]
    assert "Berlin" in choice.message.content and choice.finish_reason == "stop"
    prompt = httpx.post(server[0] + "/tokenize", json={"messages": GERMANY}).json()
    assert response.usage.prompt_tokens == prompt["count"]
    assert 1 <= response.usage.completion_tokens <= 24
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streaming_matches_and_reports_usage(client):
    whole, chunks = whole_and_streamed(client, GERMANY)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1  # the same prompt


def test_stop_strings_end_the_reply_and_never_leak(client):
    answer = client.chat.completions.create(model="smollm2", messages=GERMANY, temperature=0, max_tokens=24)
    answer = answer.choices[0].message.content
    stopped = client.chat.completions.create(
        model="smollm2", messages=GERMANY, temperature=0, max_tokens=24, stop=["Berlin"]
    )
    before = answer[: answer.index("Berlin")]
    assert stopped.choices[0].message.content in (before, before.rstrip())
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.chat.completions.create(
        model="smollm2", messages=GERMANY, temperature=0, max_tokens=24, stop=["Berlin"], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert "Ber" not in text and text == stopped.choices[0].message.content


def test_the_log_names_the_engine(server):
    assert "llama.cpp engine, 1 threads" in server[1].read_text()


def test_a_shared_system_prompt_is_reported_as_cached(client):
    def ask(question: str):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=4)

    first, second = ask("When do you open on Saturday?"), ask("Do you rent bikes?")
    assert second.usage.prompt_tokens_details.cached_tokens > 150  # the system turn, computed once
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < 150


def test_greedy_replies_are_llama_cpp_pythons_own(client, server, smollm2_gguf):
    from llama_cpp import Llama

    reference = Llama(str(smollm2_gguf), n_threads=1, n_ctx=1024, flash_attn=True, verbose=False)
    for question in ("What is the capital of Germany?", "Name three colours.", "Why is the sky blue?"):
        messages = [{"role": "user", "content": question}]
        ids = httpx.post(server[0] + "/tokenize", json={"messages": messages}).json()["tokens"]
        ours = client.completions.create(model="smollm2", prompt=ids, temperature=0, max_tokens=24).choices[0].text
        theirs = reference.create_completion(ids, temperature=0, max_tokens=24)["choices"][0]["text"]
        assert ours == theirs


# -- the engine in this process ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fmt(smollm2_gguf):
    return ChatFormat.from_pretrained(smollm2_gguf)


@pytest.fixture(scope="module")
def backend(smollm2_gguf):
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    engine = LlamaCppBackend(smollm2_gguf, threads=1, max_batch=4, max_queue=4, prefill_chunk=64)
    yield engine
    engine.close()


def _prompt(fmt: ChatFormat, question: str, system: str | None = None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return fmt.encode(messages, add_generation_prompt=True, turns="none").input_ids.tolist()


async def _collect(generation, *, stamps: list[float] | None = None) -> list[int]:
    ids = []
    async for event in generation:
        ids.append(event.token_id)
        if stamps is not None:
            stamps.append(time.monotonic())
    return ids


def test_a_long_prompt_is_prefilled_between_decoding_steps(backend, fmt):
    """While a 1,000-token prompt is read in 64-token chunks, the running streams get a token at every step."""
    long_prompt = _prompt(fmt, "Summarize: " + "the quick brown fox jumps over the lazy dog. " * 100)
    assert len(long_prompt) > 900

    async def main():
        loop = asyncio.get_running_loop()
        runners = [
            backend.submit(GenerationRequest(_prompt(fmt, q), max_tokens=400, temperature=0), loop)
            for q in ("Tell me a long story.", "Describe Paris at length.")
        ]
        stamps: list[list[float]] = [[], []]
        tasks = [asyncio.create_task(_collect(g, stamps=s)) for g, s in zip(runners, stamps, strict=True)]
        while min(len(s) for s in stamps) < 3:
            await asyncio.sleep(0.01)
        submitted = time.monotonic()
        long_stamps: list[float] = []
        await _collect(backend.submit(GenerationRequest(long_prompt, max_tokens=1), loop), stamps=long_stamps)
        for generation in runners:
            generation.cancel()
        await asyncio.gather(*tasks)
        return stamps, submitted, long_stamps[0]

    stamps, submitted, first = asyncio.run(main())
    chunks = len(long_prompt) // 64
    for times in stamps:
        during = [t for t in times if submitted <= t <= first]
        assert len(during) >= chunks - 2  # one token per step: the streams did not wait for the whole prefill


def test_a_shared_prefix_is_prefilled_once_even_when_requests_arrive_together(backend, fmt):
    prompts = [_prompt(fmt, q, SYSTEM) for q in ("Are you open on Sunday?", "How long do repairs take?", "Hi!")]
    shared = min(len(p) for p in prompts)
    while any(p[:shared] != prompts[0][:shared] for p in prompts):
        shared -= 1
    assert shared > 150

    async def main():
        loop = asyncio.get_running_loop()
        generations = [backend.submit(GenerationRequest(p, max_tokens=2, temperature=0), loop) for p in prompts]
        await asyncio.gather(*(_collect(g) for g in generations))
        return generations

    before = backend.prompt_tokens_computed
    generations = asyncio.run(main())
    computed = backend.prompt_tokens_computed - before
    assert computed <= sum(len(p) for p in prompts) - 2 * shared + len(prompts)
    assert sorted(g.cached_tokens for g in generations)[1:] == [shared, shared]


def test_a_cancelled_request_leaves_the_batch_at_once(backend, fmt):
    async def main():
        loop = asyncio.get_running_loop()
        generation = backend.submit(GenerationRequest(_prompt(fmt, "Count to a thousand."), max_tokens=500), loop)
        count = 0
        async for _ in generation:
            count += 1
            if count == 3:
                assert backend.load_now == (1, 0)
                generation.cancel()
        return count

    produced = asyncio.run(main())
    assert produced < 10 and backend.load_now == (0, 0)


def test_the_cache_is_reclaimed_when_it_is_full(smollm2_gguf):
    """Room for one 150-token prompt: prompts that share nothing each clear the idle slot that holds the last one."""
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    engine = LlamaCppBackend(smollm2_gguf, threads=1, max_batch=2, kv_tokens=256, prefill_chunk=128)
    try:

        async def main():
            loop = asyncio.get_running_loop()
            replies = []
            for n in range(3):
                prompt = [100 + n, *range(1000 + n, 1149 + n)]  # nothing in common with the one before
                replies.append(await _collect(engine.submit(GenerationRequest(prompt, max_tokens=2), loop)))
                assert engine.cached_cells <= 160  # one idle slot's cache, not two
            return replies

        replies = asyncio.run(main())
        assert [len(reply) for reply in replies] == [2, 2, 2] and engine.load_now == (0, 0)
    finally:
        engine.close()


def test_the_whole_server_on_the_engine_reports_cached_tokens_in_the_stream(backend, fmt):
    from turnkit.serve.app.routes import Server

    with serving(Server(fmt, backend, model_id="llama").app()) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello"}]
        for _ in range(2):
            chunks = list(
                client.chat.completions.create(
                    model="llama",
                    messages=messages,
                    max_tokens=3,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
        usage = chunks[-1].usage
        assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
