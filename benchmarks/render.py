"""Render time per conversation: turnkit's ``ChatFormat.render`` against ``transformers.apply_chat_template(
tokenize=False)``, measured in the same run on the same templates and conversations.

Usage: python benchmarks/render.py [--rounds N]

Both sides render with one thread. Each measurement is the median over rounds of the mean time of a batch of renders;
the ratio is transformers / turnkit (above 1.0 means turnkit is faster). Target: turnkit no slower than transformers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conversations import conversations
from corpus import llamacpp_template_dir, smollm2_tokenizer_folder

from turnkit import ChatFormat


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_tokenizer_folder())


def _median_us(fn, batch: int, rounds: int) -> float:
    for _ in range(batch):  # warm caches (compiled templates) on both sides
        fn()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - start) / batch * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batch", type=int, default=50)
    args = parser.parse_args()
    warnings.simplefilter("ignore")

    tokenizer = _tokenizer()
    folder = llamacpp_template_dir()
    cases = [("SmolLM2 (own template)", tokenizer.chat_template, "multi-turn")]
    for file, conversation in [
        ("Qwen-Qwen2.5-7B-Instruct.jinja", "tool-call-and-result"),
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", "multi-turn"),
        ("Qwen-Qwen3-0.6B.jinja", "reasoning"),
        ("openai-gpt-oss-120b.jinja", "tool-call-and-result"),
    ]:
        if folder is not None and (folder / file).is_file():
            cases.append((file.removesuffix(".jinja"), (folder / file).read_text(), conversation))
    by_name = {name: (messages, tools) for name, messages, tools in conversations()}

    print(f"{'template':42} {'conversation':22} {'transformers µs':>16} {'turnkit µs':>11} {'ratio':>6}")
    ratios = []
    for name, template, conversation in cases:
        messages, tools = by_name[conversation]
        fmt = ChatFormat.from_template(template, **tokenizer.special_tokens_map)

        def theirs(template=template, messages=messages, tools=tools):
            return tokenizer.apply_chat_template(
                messages, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
            )

        def ours(fmt=fmt, messages=messages, tools=tools):
            return fmt.render(messages, tools=tools, add_generation_prompt=True)

        assert ours() == theirs(), f"{name}: renders differ; the benchmark would compare different work"
        t_theirs = _median_us(theirs, args.batch, args.rounds)
        t_ours = _median_us(ours, args.batch, args.rounds)
        ratios.append(t_theirs / t_ours)
        print(f"{name:42} {conversation:22} {t_theirs:16.1f} {t_ours:11.1f} {t_theirs / t_ours:6.2f}")
    print(f"\nmedian ratio transformers/turnkit: {statistics.median(ratios):.2f} (target >= 1.0)")


if __name__ == "__main__":
    main()
