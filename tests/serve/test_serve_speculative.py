"""Speculative decoding from the context on the llama.cpp engine (issue 39): drafts from n-grams of the prompt and the
reply, verified in one batch, never change what a request produces. On the real embedded model: greedy token ids
(and their log-probabilities) with speculation on and off, on prompts whose reply repeats the prompt and on prompts
whose reply does not; through the server (``turnkit serve`` and ``--spec-type none``), a forced tool call decoded
under its grammar, stop strings, and seeded sampled replies; ``/metrics`` counts the drafted and accepted tokens.

Whether a draft pays depends on what the engine's steps cost, which it measures: on a busy machine a verified token
costs as much as a plain step and the engine (rightly) makes no draft, so a test that counted drafts on measured costs
failed there. Every engine and server here runs on fixed step costs (:data:`STEP_COSTS`, through the engine's
``TURNKIT_STEP_COSTS`` seam), at which drafts pay: which drafts are made then follows from the tokens alone, on any
machine, and the tests assert the same output with and without drafts and the counts that follow."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import TOOL_MODEL, TOOLS, turnkit_serve

from turnkit import ChatFormat
from turnkit.serve.engines.base import GenerationRequest
from turnkit.serve.engines.speculate import STEP_COSTS_ENV, Drafter, StepCosts

CODE = "".join(f"def scale_{i}(x):\n    return x * {i} + {i * 3}\n\n" for i in range(6))
QUESTIONS = [
    "Repeat this code exactly, then stop:\n" + CODE,  # edit-like: the reply copies the prompt
    "Rename scale to grow in this code and print it whole:\n" + CODE,
    "Write a short story about a cat.",  # the reply is new text
]
#: GPU-like step costs (a step of 2 tokens 1.02 times a plain one, of 17 1.3 times): drafts pay wherever a lookup
#: matches, whatever the machine's load.
STEP_COSTS = "1=1.0,2=1.02,17=1.3"


@pytest.fixture(scope="module")
def engines(smollm2_gguf):
    from turnkit.serve.engines.llama_cpp import LlamaCppBackend

    # two threads for batches, as served by default here; the step costs fixed (STEP_COSTS): measured ones on a busy
    # machine (or on one thread) say no draft pays, and the engine (rightly) makes none
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STEP_COSTS_ENV, STEP_COSTS)
        on = LlamaCppBackend(smollm2_gguf, threads=1, prefill_threads=2, max_batch=4)
        off = LlamaCppBackend(smollm2_gguf, threads=1, prefill_threads=2, max_batch=4, speculate=False)
    yield on, off
    on.close()
    off.close()


def _generate(engine, prompt: list[int], **sampling) -> list[tuple[int, float | None]]:
    async def main():
        request = GenerationRequest(prompt, **{"max_tokens": 64, "temperature": 0.0, **sampling})
        generation = engine.submit(request, asyncio.get_running_loop())
        return [(event.token_id, event.logprob) async for event in generation]

    return asyncio.run(main())


def test_greedy_token_ids_are_the_same_with_and_without_drafts(engines, smollm2_gguf):
    """Each prompt alone: the same ids, the same log-probabilities (to float rounding: a verified position is
    computed in a batch), and drafts were accepted (at fixed step costs at which drafts pay, whatever the machine's
    load); then all at once (a batch of streams, drafts for each)."""
    on, off = engines
    fmt = ChatFormat.from_pretrained(smollm2_gguf)
    prompts = [
        fmt.encode([{"role": "user", "content": q}], add_generation_prompt=True).input_ids.tolist() for q in QUESTIONS
    ]

    def counted(prompt: list[int]) -> tuple[list[tuple[int, float | None]], tuple[int, int]]:
        drafted, accepted = on.drafted, on.accepted
        events = _generate(on, prompt, top_logprobs=0)
        return events, (on.drafted - drafted, on.accepted - accepted)

    counts = []
    for prompt in prompts:
        (with_drafts, count), without = counted(prompt), _generate(off, prompt, top_logprobs=0)
        assert [t for t, _ in with_drafts] == [t for t, _ in without]
        assert [lp for _, lp in with_drafts] == pytest.approx([lp for _, lp in without], abs=1e-3)
        counts.append(count)
    assert on.accepted > 0 and on.drafted >= on.accepted and off.drafted == 0
    assert counts[0][1] > 0  # the edit-like reply copies its prompt: drafts accepted

    async def together(engine):
        loop = asyncio.get_running_loop()
        requests = [GenerationRequest(p, max_tokens=40, temperature=0.0, top_logprobs=2) for p in prompts]
        generations = [engine.submit(request, loop) for request in requests]

        async def events(generation):
            return [event async for event in generation]

        return await asyncio.gather(*(events(g) for g in generations))

    # Several streams in one batch: llama.cpp computes a row a little differently with the batch's make-up (drafts
    # change it, and so do other streams joining without drafts: the same requests alone and together, no drafts at
    # all, differ by up to 0.14 in log-probability here), so a reply may part only where its two likeliest tokens are
    # that close.
    for with_drafts, without in zip(asyncio.run(together(on)), asyncio.run(together(off)), strict=True):
        ids, reference = [e.token_id for e in with_drafts], [e.token_id for e in without]
        parted = next((n for n, (a, b) in enumerate(zip(ids, reference, strict=False)) if a != b), None)
        if parted is None:
            assert ids == reference
        else:
            (_, best), (_, second) = without[parted].top[:2]
            assert best - second < 0.3, (parted, without[parted].top)


def test_seeded_sampling_is_the_same_reply_with_and_without_drafts(engines, smollm2_gguf):
    """One draw of the request's generator per token either way, so a seed gives the same reply on or off (and again
    on), with penalties that depend on the reply so far."""
    on, off = engines
    fmt = ChatFormat.from_pretrained(smollm2_gguf)
    prompt = fmt.encode([{"role": "user", "content": QUESTIONS[0]}], add_generation_prompt=True).input_ids.tolist()
    sampling = {"temperature": 0.7, "top_p": 0.95, "seed": 11, "frequency_penalty": 0.2, "max_tokens": 64}
    first = _generate(on, prompt, **sampling)
    assert first == _generate(on, prompt, **sampling)
    assert [t for t, _ in first] == [t for t, _ in _generate(off, prompt, **sampling)]


# -- how long a draft: step costs and acceptance --------------------------------------------------------------------


def _costs(**seconds: float) -> StepCosts:
    costs = StepCosts()
    for size, value in seconds.items():
        costs.observe(int(size.removeprefix("s")), value)
    return costs


def test_step_costs_are_measured_means_interpolated_and_extrapolated():
    costs = StepCosts()
    assert costs.seconds(1) is None
    costs.observe(1, 1.0)
    assert costs.seconds(5) == pytest.approx(2.0)  # only one size known: the optimistic prior, a quarter a token
    costs.observe(5, 3.0)
    costs.observe(5, 4.0)  # a moving mean: 0.7 * 3 + 0.3 * 4
    assert costs.seconds(5) == pytest.approx(3.3)
    assert costs.seconds(3) == pytest.approx(1.0 + 2.3 / 2)  # between two measured sizes
    assert costs.seconds(9) == pytest.approx(3.3 + 4 * 2.3 / 4)  # past the biggest: the slope of the two biggest
    costs.observe(10_000, 99.0)  # a prompt chunk's size: never a draft's, not kept
    assert costs.seconds(9) == pytest.approx(5.6)


def _copying(drafter: Drafter, costs: StepCosts, source: list[int], steps: int, known: list[int]):
    """Drafts while the reply copies ``source`` token by token: each step the next source token comes (a draft, if
    one is made, verified against what follows). The draft lengths, and the sequence after them."""
    lengths = []
    for _ in range(steps):
        draft = drafter.draft(known, 16, 1, costs)
        lengths.append(len(draft))
        following = source[len(known) - len(source) :][: len(draft) + 1]
        accepted = next((n for n, (a, b) in enumerate(zip(draft, following, strict=False)) if a != b), len(draft))
        drafter.verified(len(draft), accepted)
        known = known + following[: accepted + 1]
    return lengths, known


def test_a_draft_is_made_at_the_length_that_pays_and_only_where_one_pays():
    """CPU-like costs (a step of 2 tokens costs twice a step of 1, of 17 seven times): drafts of a copied text start
    after a few right proposals not made (checked against the tokens that came: free evidence) and grow long; after
    drafts that are rejected none is made, and drafting starts again once the text runs along its context again;
    where verified tokens cost almost nothing (a GPU) even a draft seldom accepted pays."""
    cpu = _costs(s1=1.0, s2=2.0, s3=2.8, s5=3.2, s9=4.2, s17=7.0)
    source = list(range(100, 300))  # the prompt; the reply copies it from its start
    drafter = Drafter(16)
    lengths, known = _copying(drafter, cpu, source, 12, [*source, *source[:8]])
    assert lengths[0] == 0 and lengths[-1] == 16  # first the evidence of proposals not made, then ever longer drafts
    for _ in range(4):
        drafter.verified(8, 0)  # the reply left the copied text: drafts rejected whole
    lengths, _ = _copying(drafter, cpu, source, 12, known)
    assert lengths[0] == 0 and lengths[-1] >= 8  # back to drafting, on evidence it did not pay for
    assert Drafter(16).draft([*source, 7, 8, 9], 16, 1, cpu) == []  # no match, no draft
    prose = Drafter(16)
    for _ in range(3):
        prose.verified(4, 1)
    assert prose.draft([*source, *source[:8]], 16, 1, cpu) == []
    assert len(prose.draft([*source, *source[:8]], 16, 1, _costs(s1=1.0, s2=1.02, s17=1.3))) > 0
    assert Drafter(16).draft([*source, *source[:8]], 16, 1, StepCosts()) == []  # no plain step measured yet


# -- through the server ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def servers():
    common = (*TOOL_MODEL, "--prefill-threads", "2", "--no-ui")  # two, as in the engines fixture
    env = {STEP_COSTS_ENV: STEP_COSTS}  # both: only the drafts may differ
    with (
        turnkit_serve(*common, name="spec-on", env=env) as (on, _),
        turnkit_serve(*common, "--spec-type", "none", env=env) as (off, _),
    ):
        yield on, off


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _spec_counts(url: str) -> tuple[float, float]:
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics").text)}
    drafted = sum(s.value for s in families["turnkit_spec_decode_draft_tokens"].samples)
    accepted = sum(s.value for s in families["turnkit_spec_decode_accepted_tokens"].samples)
    return drafted, accepted


def test_forced_call_stop_strings_and_seeds_through_the_server(servers):
    """A forced tool call (decoded under its schema's grammar), a reply cut by stop strings, an edit-like reply with
    log-probabilities, and a seeded sampled reply: the same on a server with speculation and one started with
    ``--spec-type none``; ``/metrics`` counts drafted and accepted tokens on the first only (at fixed step costs, at
    which drafts pay)."""
    on, off = servers
    messages = [{"role": "user", "content": "What is the weather in Paris? Then in Rome, then in Oslo."}]
    forced = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    edit = [{"role": "user", "content": QUESTIONS[1]}]
    replies = []
    for url in (on, off):
        client = _client(url)
        call = client.chat.completions.create(
            model="smollm2", messages=messages, temperature=0, max_tokens=48, **forced
        )
        stopped = client.chat.completions.create(
            model="smollm2", messages=edit, temperature=0, max_tokens=120, stop=["scale_4", "grow_4"]
        )
        logged = client.chat.completions.create(
            model="smollm2", messages=edit, temperature=0, max_tokens=80, logprobs=True, top_logprobs=2
        )
        seeded = [
            client.chat.completions.create(model="smollm2", messages=edit, temperature=0.8, seed=5, max_tokens=60)
            for _ in range(2)
        ]
        assert seeded[0].choices[0].message.content == seeded[1].choices[0].message.content
        tokens = [
            (entry.token, [top.token for top in entry.top_logprobs]) for entry in logged.choices[0].logprobs.content
        ]
        replies.append(
            (
                [(c.function.name, c.function.arguments) for c in call.choices[0].message.tool_calls or []],
                call.choices[0].finish_reason,
                stopped.choices[0].message.content,
                stopped.choices[0].finish_reason,
                stopped.usage.completion_tokens,
                tokens,
                seeded[0].choices[0].message.content,
            )
        )
    assert replies[0] == replies[1]
    assert replies[0][0] and replies[0][0][0][0] == "get_weather"
    drafted, accepted = _spec_counts(on)
    assert drafted >= accepted > 0
    assert _spec_counts(off) == (0, 0)
