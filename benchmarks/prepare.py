"""Dataset preparation speed: ``turnkit prepare`` with 1 and 2 workers against ``datasets.map`` with
``apply_chat_template(..., return_assistant_tokens_mask=True)`` in one process, in the same run.

Usage: python benchmarks/prepare.py [--conversations N] [--repeats R]
       python benchmarks/prepare.py --memory 200000 [--memory-workers 2]   (peak RSS instead)

The data: N generated conversations (multi-turn, a third with tool calls and results, five shared system prompts),
rendered with the qwen2.5 family's template with ``{% generation %}`` blocks added (so that transformers can make
assistant masks at all), over the SmolLM2 tokenizer with Qwen's tool markers added. Every repetition prepares fresh
conversations (no cache carries over); medians are reported. Targets: 1 worker at least 2x the datasets.map baseline;
2 workers at least 1.7x 1 worker.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
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


def _model(work: Path) -> Path:
    tokenizer = tokenizer_with_markers(
        smollm2_tokenizer_folder(), ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
    )
    tokenizer.chat_template = generation_template()
    model = work / "model"
    tokenizer.save_pretrained(model)
    (model / "chat_template.jinja").write_text(generation_template())
    return model


def _write(path: Path, count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    records = [conversation(rng) for _ in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def _baseline(tokenizer, records: list[dict]) -> tuple[float, int]:
    import datasets

    dataset = datasets.Dataset.from_list([{"messages": json.dumps(r["messages"]),
                                           "tools": json.dumps(r["tools"])} for r in records])  # fmt: skip

    def encode(batch):
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
    mapped = dataset.map(encode, batched=True, batch_size=256, remove_columns=["messages", "tools"])
    seconds = time.perf_counter() - start
    return seconds, sum(len(ids) for ids in mapped["input_ids"])


def _memory(work: Path, model: Path, count: int, workers: int) -> None:
    """Peak RSS of ``turnkit prepare`` on ``count`` records, in a fresh process: the main process and its workers."""
    data = work / "memory.jsonl"
    rng = random.Random(12345)
    with data.open("w") as handle:  # streamed: this process stays small (a child inherits its peak RSS on Linux)
        for _ in range(count):
            handle.write(json.dumps(conversation(rng)) + "\n")
    script = (
        "import json, resource, sys\n"
        "from pathlib import Path\n"
        "try:\n"
        "    Path('/proc/self/clear_refs').write_text('5')  # the peak RSS mark starts here, not in the parent\n"
        "except OSError:\n"
        "    pass\n"
        "from turnkit.data import PrepareConfig, prepare\n"
        "m = prepare([sys.argv[1]], sys.argv[2], PrepareConfig(model=sys.argv[3]), workers=int(sys.argv[4]), "
        "progress=False)\n"
        "status = Path('/proc/self/status').read_text() if Path('/proc/self/status').exists() else ''\n"
        "peak = [int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith('VmHWM')]\n"
        "print(json.dumps({'written': m['counts']['written'], 'seconds': m['seconds'], "
        "'main_mib': peak[0] if peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "
        "'worker_mib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))\n"
    )
    command = [sys.executable, "-c", script, str(data), str(work / "memory-out"), str(model), str(workers)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    size = data.stat().st_size / 2**20
    print(f"{count:,} records ({size:,.0f} MiB of JSONL), {workers} worker(s): {found['written']:,} written in "
          f"{found['seconds']:.0f} s; peak RSS {found['main_mib']:.0f} MiB main process, "
          f"{found['worker_mib']:.0f} MiB largest worker")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    # 8 shards of 1,024: with fewer shards than workers x 4 the last shard runs alone, which measures the tail, not
    # the per-record work (3,000 records are 3 shards: 2 workers can do at most 1.5x one)
    parser.add_argument("--conversations", type=int, default=8_192)
    parser.add_argument("--repeats", type=int, default=6, help="runs of each variant, each on fresh data")
    parser.add_argument("--memory", type=int, metavar="N", help="instead: peak RSS of prepare on N records")
    parser.add_argument("--memory-workers", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import datasets

    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix="turnkit-bench-"))
    try:
        model = _model(work)
        if args.memory:
            _memory(work, model, args.memory, args.memory_workers)
            return
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model)
        n = args.conversations
        # warm up, as the baseline's tokenizer is loaded before it is timed: turnkit's format, loaded once a process
        _write(work / "warm.jsonl", 20, seed=-1)
        prepare([str(work / "warm.jsonl")], work / "warm", PrepareConfig(model=str(model)), progress=False)
        rates: dict[str, list[float]] = {"baseline": [], "1": [], "2": []}
        ratios: dict[str, list[float]] = {"1/base": [], "2/1": []}
        tokens = 0
        for repeat in range(args.repeats):
            # fresh conversations every repetition: no cache carries over from an earlier one
            data = work / f"data-{repeat}.jsonl"
            records = _write(data, n, seed=repeat)
            seconds: dict[str, float] = {}
            variants = ["baseline", "1", "2"]
            for variant in variants[repeat % 3 :] + variants[: repeat % 3]:  # the order rotates: load drifts
                if variant == "baseline":
                    seconds[variant], tokens = _baseline(tokenizer, records)
                    continue
                out = work / f"out-{repeat}-{variant}"
                config = PrepareConfig(model=str(model))
                start = time.perf_counter()
                manifest = prepare([str(data)], out, config, workers=int(variant), progress=False)
                seconds[variant] = time.perf_counter() - start
                assert manifest["counts"]["written"] == n, manifest["counts"]
                shutil.rmtree(out)
            assert manifest["tokens"] == tokens, (manifest["tokens"], tokens)
            base, one, two = seconds["baseline"], seconds["1"], seconds["2"]
            rates["baseline"].append(n / base)
            rates["1"].append(n / one)
            rates["2"].append(n / two)
            ratios["1/base"].append(base / one)
            ratios["2/1"].append(one / two)
            print(f"run {repeat + 1}: baseline {n / base:,.0f}/s, 1 worker {n / one:,.0f}/s, 2 workers {n / two:,.0f}/s"
                  f" (1 worker / baseline {base / one:.2f}, 2 / 1 {one / two:.2f})", flush=True)  # fmt: skip
        med = statistics.median
        print(f"\n{n:,} conversations per run, {tokens / n:.0f} tokens each, medians of {args.repeats} runs")
        print(f"tokenizer path: {manifest['tokenizer_path']}\n")
        print(f"{'':46} {'records/s':>10} {'tokens/s':>10}")
        rows = [
            ("datasets.map + apply_chat_template (1 proc)", med(rates["baseline"])),
            ("turnkit prepare, 1 worker", med(rates["1"])),
            ("turnkit prepare, 2 workers", med(rates["2"])),
        ]
        for label, rate in rows:
            print(f"{label:46} {rate:>10,.0f} {rate * tokens / n:>10,.0f}")
        print(f"\n1 worker / datasets.map = {med(ratios['1/base']):.2f} (target >= 2.0)")
        print(f"2 workers / 1 worker = {med(ratios['2/1']):.2f} (target >= 1.7; os.cpu_count() = {os.cpu_count()})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
