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
from turnkit.errors import QueueTimeoutError
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
test_a_client_that_leaves_a_whole_reply_frees_its_slot = core.test_a_client_that_leaves_a_whole_reply_frees_its_slot
test_return_token_ids_gives_the_prompt_and_the_sampled_ids = (
    core.test_return_token_ids_gives_the_prompt_and_the_sampled_ids
)
test_a_next_turn_sent_as_ids_is_answered = core.test_a_next_turn_sent_as_ids_is_answered
test_completions_return_token_ids = core.test_completions_return_token_ids
test_stop_token_ids_end_the_reply_at_that_id = core.test_stop_token_ids_end_the_reply_at_that_id
test_completions_stop_token_ids = core.test_completions_stop_token_ids
long_reply = core.long_reply


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
    """The start line says what the engine chose, the host cache and speculative decoding included (their defaults:
    llama-server's 8192 MiB, drafts of up to 16 tokens)."""
    text = server[1].read_text()
    assert "llama.cpp engine" in text and "threads: 1 decoding" in text and "key/value cache" in text
    assert "8192 MiB of host memory for parked prefixes" in text
    assert "speculative decoding: drafts of up to 16 tokens" in text
    assert "n_ctx_seq" not in text  # llama.cpp's warning about the shared cache: turnkit says what it chose instead


def test_a_shared_system_prompt_is_reported_as_cached(client):
    def ask(question: str):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
        return client.chat.completions.create(model="smollm2", messages=messages, temperature=0, max_tokens=4)

    first, second = ask("When do you open on Saturday?"), ask("Do you rent bikes?")
    assert second.usage.prompt_tokens_details.cached_tokens > 150  # the system turn, computed once
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < 150


def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed with prometheus_client's own parser: (sample name, sorted labels) to value."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_requests_tokens_and_latencies(client, server):
    """/metrics before and after a few requests: the counters moved by exactly what the answers' usage says."""
    before = _metrics(server[0])
    chat, stream = whole_and_streamed(client, GERMANY, max_tokens=8)
    completion = client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=5)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="smollm2", messages=GERMANY, max_tokens=-1)
    after = _metrics(server[0])

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    chat_ok = {"endpoint": "/v1/chat/completions", "model": "smollm2", "status": "200"}
    assert moved("turnkit_requests_total", **chat_ok) == 2
    assert moved("turnkit_requests_total", **{**chat_ok, "status": "400", "model": ""}) == 1
    assert moved("turnkit_requests_total", endpoint="/v1/completions", model="smollm2", status="200") == 1
    usages = [chat.usage, stream[-1].usage, completion.usage]
    assert moved("turnkit_prompt_tokens_total", model="smollm2") == sum(u.prompt_tokens for u in usages)
    assert moved("turnkit_generation_tokens_total", model="smollm2") == sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages if u.prompt_tokens_details)
    assert moved("turnkit_prompt_cached_tokens_total", model="smollm2") == cached > 0  # the same question twice
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        assert moved(f"turnkit_{histogram}_count", model="smollm2") == 3
    assert after[("turnkit_kv_cache_capacity_tokens", (("model", "smollm2"),))] > 0
    assert after[("turnkit_requests_running", (("model", "smollm2"),))] == 0
    health = httpx.get(server[0] + "/health").json()
    cache = health["models"][0]["kv_cache"]
    assert cache["tokens"] == after[("turnkit_kv_cache_capacity_tokens", (("model", "smollm2"),))]
    assert health["aborted"] == after.get(
        ("turnkit_requests_aborted_total", (("endpoint", "/v1/chat/completions"), ("model", "smollm2"))), 0
    )


def test_a_context_past_the_trained_one_is_rope_scaled(smollm2_gguf):
    """--context 16384 on a model trained on 8,192: said once at start, reported by /v1/models, and a 9,500-token
    prompt is admitted (the client leaves once the answer has started: its prefill would take a minute here); a
    prompt over 16,384 is a 400 naming the context."""
    arguments = ["--model", str(smollm2_gguf), "--model-id", "smollm2", "--threads", "1", "--no-ui"]
    with turnkit_serve(*arguments, "--context", "16384", "--kv-tokens", "16384", name="serve-context") as (url, log):
        card = httpx.get(url + "/v1/models").json()["data"][0]
        assert card["max_model_len"] == 16384 and card["metadata"]["kv_cache_tokens"] == 16384
        assert "RoPE scaled with YaRN 2x past the model's trained 8192 tokens" in log.read_text()
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "word " * 9500}], "max_tokens": 4}
        assert httpx.post(url + "/tokenize", json=body).json()["count"] > 9500
        with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as answer:
            assert answer.status_code == 200  # admitted: past the trained context, within --context
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").json()["generating"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.get(url + "/health").json()["generating"] == 0
        body["messages"][0]["content"] = "word " * 17000
        refused = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
        assert refused.status_code == 400 and "context is 16384 tokens" in refused.json()["error"]["message"]


def test_greedy_replies_are_llama_cpp_pythons_own(client, server, smollm2_gguf):
    from llama_cpp import Llama

    reference = Llama(str(smollm2_gguf), n_threads=1, n_ctx=1024, flash_attn=True, verbose=False, logits_all=True)
    for question in ("What is the capital of Germany?", "Name three colours.", "Why is the sky blue?"):
        messages = [{"role": "user", "content": question}]
        ids = httpx.post(server[0] + "/tokenize", json={"messages": messages}).json()["tokens"]
        ours = client.completions.create(model="smollm2", prompt=ids, temperature=0, max_tokens=24, logprobs=2)
        theirs = reference.create_completion(ids, temperature=0, max_tokens=24, logprobs=2)["choices"][0]
        if ours.choices[0].text == theirs["text"]:
            continue
        # The server's cache held other requests' cells (parked in host memory since), so this prompt's cells sit
        # elsewhere than in a fresh context, and llama.cpp's flash attention adds up in cell order (in half precision):
        # log-probabilities differ by up to ~0.2, so a reply may part from the fresh context's only where its two
        # likeliest tokens nearly tie.
        tokens, top = theirs["logprobs"]["tokens"], theirs["logprobs"]["top_logprobs"]
        mine = ours.choices[0].logprobs.tokens
        parted = next(n for n, (a, b) in enumerate(zip(mine, tokens, strict=False)) if a != b)
        best, second = sorted(top[parted].values(), reverse=True)[:2]
        assert best - second < 0.5, (question, parted, top[parted])


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
                assert (backend.load_now().running, backend.load_now().waiting) == (1, 0)
                generation.cancel()
        return count

    produced = asyncio.run(main())
    assert produced < 10 and (backend.load_now().running, backend.load_now().waiting) == (0, 0)


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
        assert [len(reply) for reply in replies] == [2, 2, 2] and engine.load_now().running == 0
    finally:
        engine.close()


def test_a_finished_conversation_is_parked_in_host_memory_and_comes_back(smollm2_gguf, fmt):
    """Placing another request parks the finished conversation's cells in host memory and clears them from the
    cache (the running requests' attention then spans their own cells only: on this machine kind a 4,600-token prompt
    took 18 s instead of 14 s beside sixteen idle prefixes); the conversation's next turn gets them back instead of
    computing them, and replies as an engine that kept them in its cache does (``cache_ram_mib=0``, where idle
    prefixes stay, and a request that only starts like one takes a copy of that start in an empty slot), to
    rounding."""
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    parking = LlamaCppBackend(smollm2_gguf, threads=1, max_batch=2)
    keeping = LlamaCppBackend(smollm2_gguf, threads=1, max_batch=2, cache_ram_mib=0)
    first, other = _prompt(fmt, "Are you open on Sunday?", SYSTEM), _prompt(fmt, "Hi!")
    try:

        def conversation(engine):
            async def main():
                loop = asyncio.get_running_loop()
                greedy = {"max_tokens": 8, "temperature": 0.0, "top_logprobs": 2}
                reply = await _collect(engine.submit(GenerationRequest(first, **greedy), loop))
                await _collect(engine.submit(GenerationRequest(other, **greedy), loop))
                held = engine.cached_cells
                again = engine.submit(GenerationRequest([*first, *reply, *other[-6:]], **greedy), loop)
                events = [event async for event in again]
                return held, again.cached_tokens, events

            return asyncio.run(main())

        held, reused, events = conversation(parking)
        assert held < len(first) <= parking._slots.host.tokens + len(first)  # parked, not in the cache
        assert reused >= len(first)
        kept_held, kept_reused, kept_events = conversation(keeping)
        assert kept_held >= len(first) and kept_reused == reused
        # The same reply, to llama.cpp's rounding, which moves with where the cells sit (flash attention adds up in
        # cell order, in half precision): the two may part only where the two likeliest tokens nearly tie.
        ids, kept_ids = [e.token_id for e in events], [e.token_id for e in kept_events]
        parted = next((n for n, (a, b) in enumerate(zip(ids, kept_ids, strict=True)) if a != b), None)
        if parted is not None:
            (_, best), (_, second) = kept_events[parted].top[:2]
            assert best - second < 0.5, (parted, kept_events[parted].top)
    finally:
        parking.close()
        keeping.close()


def test_admission_waits_for_cache_room_and_refuses_past_the_queue_deadline(smollm2_gguf):
    """A request is admitted only when its prompt plus max_tokens fits in what the cache has not promised; one that
    waits past the queue's deadline is refused before any token, with a time to retry; room frees when a request
    leaves. The load reading shows it all at once."""
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    engine = LlamaCppBackend(smollm2_gguf, threads=1, max_batch=4, kv_tokens=1024, queue_timeout=1.5)
    try:

        async def main():
            loop = asyncio.get_running_loop()
            big = engine.submit(GenerationRequest([1, *range(2000, 2020)], max_tokens=1000, temperature=0), loop)
            await big.started()
            reading = engine.load_now()
            assert (reading.running, reading.kv_reserved, reading.kv_capacity) == (1, 1021, 1024)
            small = GenerationRequest([1, *range(3000, 3050)], max_tokens=50, temperature=0)
            refused = engine.submit(small, loop)  # 101 more tokens do not fit: it waits
            await asyncio.sleep(0.2)
            assert engine.load_now().waiting == 1
            with pytest.raises(QueueTimeoutError) as refusal:
                await refused.started()
            assert refusal.value.retry_after >= 1 and await _collect_or_error(refused) == "refused"
            assert engine.load_now().running == 1  # the big one ran all along (1,000 tokens take seconds)
            admitted = engine.submit(small, loop)
            big.cancel()
            await admitted.started()
            return len(await _collect(admitted))

        assert asyncio.run(main()) == 50
        reading = engine.load_now()  # nothing running, waiting or promised (drafts counted since the start)
        assert reading == type(reading)(0, 0, 1024, 0, engine.cached_cells, engine.drafted, engine.accepted)
    finally:
        engine.close()


async def _collect_or_error(generation) -> str:
    try:
        await _collect(generation)
    except QueueTimeoutError:
        return "refused"
    return "ended"


def test_a_full_cache_preempts_the_youngest_request_and_recomputes_it(smollm2_gguf):
    """Admission that promises more than the cache holds (as vLLM's optimistic scheduler does): when a step finds no
    room, the youngest request is preempted and recomputed later from its prompt and what it generated; every reply
    still gets all its tokens, none fails."""
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    engine = LlamaCppBackend(
        smollm2_gguf, threads=1, max_batch=3, kv_tokens=512, admission_tokens=4096, prefill_chunk=128
    )
    try:

        async def main():
            loop = asyncio.get_running_loop()
            prompts = [[1, *range(4000 + 100 * n, 4060 + 100 * n)] for n in range(3)]  # nothing shared
            generations = [engine.submit(GenerationRequest(p, max_tokens=250, temperature=0), loop) for p in prompts]
            return await asyncio.gather(*(_collect(g) for g in generations))

        replies = asyncio.run(main())
        assert [len(reply) for reply in replies] == [250, 250, 250]  # 3 x 311 tokens in a cache of 512
        assert engine.preemptions >= 1 and engine.load_now().running == 0
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
