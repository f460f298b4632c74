"""Encoding speed, measured in one run on the same conversations:

  (a) transformers ``apply_chat_template(tokenize=True, return_assistant_tokens_mask=True)`` on a template with
      ``{% generation %}`` blocks (SmolLM2's ChatML template with the blocks added);
  (b) the bare tokenizer on the rendered text: the transformers tokenizer call users make,
      ``tokenizer(text, add_special_tokens=False)``; and (b') its Rust backend alone (``backend.encode(text).ids``),
      the stricter floor;
  (c) ``fmt.encode`` (render, safety, ids, masks, attribution), one conversation at a time, on the exact fast
      tokenizer path (tiktoken, where the tokenizer allows it); (c'') the same on the ``tokenizers`` path;
  (d) ``fmt.encode_batch`` on the fast path (one thread: tiktoken encodes piece by piece under the GIL, where a
      tokenizer thread waits for the rendering thread); (d'') ``fmt.encode_batch`` on the ``tokenizers`` path, whose
      tokenizer thread encodes each chunk without the GIL, on two Rust threads.

Usage: python benchmarks/encode.py [--conversations N] [--rounds R]

Targets: (c) at most 1.10x the time of (b) and at least 2x faster than (a); (d) at least as fast as (c).
Medians over rounds; the machine is shared and noisy.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "2")  # the tokenizer's thread pool, fixed when it first starts
os.environ["TOKENIZERS_PARALLELISM"] = "true"

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import smollm2_tokenizer_folder
from shapes import SMOLLM2_TAGGED as GENERATION_TEMPLATE

from turnkit import ChatFormat
from turnkit.tokenizer.fast import ENV_SWITCH

_SENTENCE = (
    "the model learns to stop when it emits the end of turn marker and every assistant reply is trained with it "
    "tokens data template render encode mask label prompt system user assistant tool call result weather Paris "
    "1024 3.14 json {key: value} <b>bold</b> naïve café 東京 🙂 - ; : ( ) [ ] quick brown fox jumps over lazy dog"
)
WORDS = _SENTENCE.split()


def _paragraph(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def conversations(count: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Multi-turn conversations of about 1,300 tokens with a shared system prompt, like an SFT dataset."""
    rng = random.Random(seed)
    system = "You are a careful assistant. " + _paragraph(random.Random(99), 60)
    out = []
    for _ in range(count):
        messages = [{"role": "system", "content": system}]
        for _ in range(3):
            messages.append({"role": "user", "content": _paragraph(rng, rng.randint(40, 90))})
            messages.append({"role": "assistant", "content": _paragraph(rng, rng.randint(90, 160))})
        out.append(messages)
    return out


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_folder())


def _interleaved(variants: dict, items: int, rounds: int) -> dict[str, float]:
    """Median µs per conversation of each variant; the variants take turns inside every round, so that a noisy
    neighbour slows all of them alike rather than whichever happened to run at that moment."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for run, threads in variants.values():  # warm up: compiled templates, the BPE word caches
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads else "false"
        run()
    for _ in range(rounds):
        for name, (run, threads) in variants.items():
            os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads else "false"  # read at every tokenizer call
            start = time.perf_counter()
            run()
            samples[name].append((time.perf_counter() - start) / items * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    tokenizer = _tokenizer()
    backend = tokenizer.backend_tokenizer
    fmt = ChatFormat.from_template(GENERATION_TEMPLATE, tokenizer=tokenizer, **tokenizer.special_tokens_map)
    os.environ[ENV_SWITCH] = "0"  # read once, when a binding first encodes data
    slow = ChatFormat.from_template(GENERATION_TEMPLATE, tokenizer=tokenizer, **tokenizer.special_tokens_map)
    slow_path = slow.tokenizer.tokenizer_path
    del os.environ[ENV_SWITCH]
    data = conversations(args.conversations)
    texts = [fmt.render(m) for m in data]
    tokens = sum(len(backend.encode(t, add_special_tokens=False).ids) for t in texts)

    reference = tokenizer.apply_chat_template(
        data[0], chat_template=GENERATION_TEMPLATE, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ours = fmt.encode(data[0])
    assert ours.input_ids.tolist() == list(reference["input_ids"]), "different ids: the comparison would be unfair"
    assert ours.assistant_mask.tolist() == list(reference["assistant_masks"]), "different masks"
    assert slow.encode(data[0]).input_ids.tolist() == ours.input_ids.tolist()
    assert fmt.encode_batch(data[:4])[3].input_ids.tolist() == fmt.encode(data[3]).input_ids.tolist()

    def transformers_masks():
        for messages in data:
            tokenizer.apply_chat_template(
                messages,
                chat_template=GENERATION_TEMPLATE,
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )

    def bare():
        for text in texts:
            tokenizer(text, add_special_tokens=False)

    def bare_backend():
        for text in texts:
            _ = backend.encode(text, add_special_tokens=False).ids

    def fresh_cache():
        # Every round is one pass over a dataset: no head start from the text cached in earlier rounds, only what
        # repeats within the pass (the shared system prompt) is found in the cache.
        fmt.encoder.segment_cache.clear()

    def encode():
        fresh_cache()
        for messages in data:
            fmt.encode(messages)

    def encode_tokenizers_path():
        slow.encoder.segment_cache.clear()
        for messages in data:
            slow.encode(messages)

    def encode_turn_masks():
        fresh_cache()
        for messages in data:
            fmt.encode(messages, masks="turns")

    def encode_batch():
        fresh_cache()
        for start in range(0, len(data), 32):
            fmt.encode_batch(data[start : start + 32])

    def encode_batch_tokenizers_path():
        slow.encoder.segment_cache.clear()
        for start in range(0, len(data), 32):
            slow.encode_batch(data[start : start + 32])

    n = len(data)
    results = _interleaved(
        {
            "(a) transformers apply_chat_template + assistant mask": (transformers_masks, False),
            "(b) bare tokenizer on the rendered text": (bare, False),
            "(b') its Rust backend alone": (bare_backend, False),
            "(c) fmt.encode": (encode, False),
            "(c') fmt.encode, masks from turns (no generation blocks)": (encode_turn_masks, False),
            "(d) fmt.encode_batch": (encode_batch, False),
            "(c'') fmt.encode on the tokenizers path": (encode_tokenizers_path, False),
            "(d'') fmt.encode_batch on the tokenizers path, 2 threads": (encode_batch_tokenizers_path, True),
        },
        n,
        args.rounds,
    )
    print(f"{n} conversations, {tokens / n:.0f} tokens each on average, median of {args.rounds} rounds")
    print(f"tokenizer path: {fmt.tokenizer.tokenizer_path}; (c''): {slow_path}\n")
    for name, us in results.items():
        print(f"{name:58} {us:9.1f} µs/conversation")
    a, b, b2, c, c2, d, c3, d3 = results.values()
    print()
    print(f"(c) / (b) = {c / b:.3f}   (target <= 1.10)")
    print(f"(c) / (b') = {c / b2:.3f}  (against the Rust backend alone)")
    print(f"(c') / (b) = {c2 / b:.3f}")
    print(f"(a) / (c) = {a / c:.2f}    (target >= 2.0: encode + masks against transformers with masks)")
    print(f"(a) / (c'') = {a / c3:.2f}   (the same on the tokenizers path)")
    print(f"(c) / (d) = {c / d:.2f}    (target >= 1.0: batch throughput over one-by-one)")
    print(f"(c'') / (d'') = {c3 / d3:.2f}  (the same on the tokenizers path, with its tokenizer thread)")


if __name__ == "__main__":
    main()
