"""Dataset preparation speed: ``turnkit prepare`` with 1 and 2 workers against ``datasets.map`` with
``apply_chat_template(..., return_assistant_tokens_mask=True)`` in one process, in the same run.

Usage: python benchmarks/prepare.py [--conversations N]

The data: N generated conversations (multi-turn, a third with tool calls and results, five shared system prompts),
rendered with the qwen2.5 family's template with ``{% generation %}`` blocks added (so that transformers can make
assistant masks at all), over the SmolLM2 tokenizer with Qwen's tool markers added. Targets: 1 worker at least 1.5x
the datasets.map baseline; 2 workers at least 1.7x 1 worker.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import smollm2_tokenizer_folder, tokenizer_with_markers

from turnkit import families
from turnkit.data import PrepareConfig, prepare

SYSTEMS = [
    "You are a helpful assistant. Answer briefly and precisely, and say when you do not know.",
    "You are a support agent for an airline. Be polite, check booking details, never invent flight numbers.",
    "You are a coding assistant. Prefer Python, explain your reasoning, and include short examples.",
    "You are a travel planner. Suggest itineraries with times, budgets and alternatives for bad weather.",
    "You are a tutor for high-school mathematics. Guide the student step by step without giving away answers.",
]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Flights between two airports.",
     "parameters": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"},
                                                      "date": {"type": "string"}}, "required": ["from", "to"]}}},
]  # fmt: skip
WORDS = (
    "please could you explain how the weather in paris affects flights to london tomorrow morning and what "
    "options exist for a family of four with two children and a dog travelling on a budget in the spring"
).split()


def _text(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))).capitalize() + "."


def conversation(rng: random.Random) -> dict:
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}]
    tools = None
    for turn in range(rng.randint(2, 4)):
        messages.append({"role": "user", "content": _text(rng, 10, 40)})
        if turn == 0 and rng.random() < 0.33:
            tools = TOOLS
            city = rng.choice(["Paris", "London", "Oslo", "Rome"])
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                    ],
                }
            )
            messages.append({"role": "tool", "content": json.dumps({"city": city, "temp_c": rng.randint(-5, 30)})})
        messages.append({"role": "assistant", "content": _text(rng, 20, 80)})
    return {"messages": messages, "tools": tools}


def generation_template() -> str:
    """The qwen2.5 family's template with {% generation %} around what each assistant turn writes."""
    text = families.get("qwen2.5").template
    text = text.replace(
        "{{- '<|im_start|>assistant' -}}\n        {%- if message.content -%}",
        "{{- '<|im_start|>assistant' -}}\n        {%- generation -%}\n        {%- if message.content -%}",
    )
    text = text.replace(
        "{%- endfor -%}\n        {{- '<|im_end|>\\n' -}}",
        "{%- endfor -%}\n        {{- '<|im_end|>' -}}\n        {%- endgeneration -%}\n        {{- '\\n' -}}",
    )
    other_turn = "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ text_of(message.content) ~ '<|im_end|>\\n' -}}"
    text = text.replace(
        "{%- else -%}\n        " + other_turn,
        "{%- elif message.role == 'assistant' -%}\n        {{- '<|im_start|>assistant\\n' -}}{%- generation -%}"
        "{{- text_of(message.content) ~ '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}\n    {%- else -%}\n"
        "        {{- '<|im_start|>' ~ message.role ~ '\\n' ~ text_of(message.content) ~ '<|im_end|>\\n' -}}",
    )
    assert text.count("generation -%}") == 2 * 2, "the family template changed; update the benchmark"
    return text


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=20_000)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import datasets

    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix="turnkit-bench-"))
    try:
        tokenizer = tokenizer_with_markers(
            smollm2_tokenizer_folder(), ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
        )
        tokenizer.chat_template = generation_template()
        model = work / "model"
        tokenizer.save_pretrained(model)
        (model / "chat_template.jinja").write_text(generation_template())
        rng = random.Random(0)
        records = [conversation(rng) for _ in range(args.conversations)]
        data = work / "data.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in records))

        dataset = datasets.Dataset.from_list([{"messages": json.dumps(r["messages"]),
                                               "tools": json.dumps(r["tools"])} for r in records])  # fmt: skip

        def baseline(batch):
            out = {"input_ids": [], "assistant_masks": []}
            for messages, tools in zip(batch["messages"], batch["tools"], strict=True):
                encoded = tokenizer.apply_chat_template(
                    json.loads(messages),
                    tools=json.loads(tools),
                    tokenize=True,
                    return_dict=True,
                    return_assistant_tokens_mask=True,
                )
                out["input_ids"].append(encoded["input_ids"])
                out["assistant_masks"].append(encoded["assistant_masks"])
            return out

        start = time.perf_counter()
        mapped = dataset.map(baseline, batched=True, batch_size=256, remove_columns=["messages", "tools"])
        base_seconds = time.perf_counter() - start
        tokens = sum(len(ids) for ids in mapped["input_ids"])

        results = {}
        for workers in (1, 2):
            out = work / f"out-{workers}"
            start = time.perf_counter()
            manifest = prepare([str(data)], out, PrepareConfig(model=str(model)), workers=workers, progress=False)
            results[workers] = time.perf_counter() - start
            assert manifest["counts"]["written"] == args.conversations, manifest["counts"]
            assert manifest["tokens"] == tokens, (manifest["tokens"], tokens)
        n = args.conversations
        print(f"{n:,} conversations, {tokens:,} tokens ({tokens / n:.0f} per conversation)\n")
        print(f"{'':42} {'records/s':>10} {'tokens/s':>10}")
        label = "datasets.map + apply_chat_template (1 proc)"
        print(f"{label:42} {n / base_seconds:>10,.0f} {tokens / base_seconds:>10,.0f}")
        for workers, seconds in results.items():
            label = f"turnkit prepare, {workers} worker{'s' if workers > 1 else ''}"
            print(f"{label:42} {n / seconds:>10,.0f} {tokens / seconds:>10,.0f}")
        print(f"\n1 worker / datasets.map = {base_seconds / results[1]:.2f} (target >= 1.5)")
        print(f"2 workers / 1 worker = {results[1] / results[2]:.2f} (target >= 1.7)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
