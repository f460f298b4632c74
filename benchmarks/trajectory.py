"""What a turn's delta costs in an agent episode, measured in one run on the same episodes:

  (a) ``traj.add_messages`` of :class:`turnkit.trajectory.Trajectory`: the tool result appended as the template's
      own ids after the sampled reply (the sampled ids are kept; what the step computes is the delta, and the check
      that the template kept the history);
  (b) the re-render a loop without token ids does every turn: ``apply_chat_template(history, tokenize=True,
      add_generation_prompt=True)`` of the whole history with transformers.

Episodes of 8, 128 and 200 turns on the embedded SmolLM2 (its real tokenizer and template), each turn a reply of
about 160 tokens and a tool result of about 160 (200 turns: about 64k tokens). Printed: the median cost of the last
turns (where the history is longest) and the CPU time of the whole episode, each side and their ratio (reference /
turnkit: above 1 means turnkit is cheaper). Medians over rounds; the machine is shared and noisy.

Usage: python benchmarks/trajectory.py [--turns 8,128,200] [--rounds R] [--words W]

``--words W`` sets the words of each reply and tool result (110 by default; 200 makes 128 turns about 64k tokens).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from corpus import smollm2_tokenizer_folder

from turnkit import ChatFormat

_WORDS = (
    "the tool returned a table of values for the city weather time zone result rows columns json key value error "
    "retry file path line function call arguments 42 3.14 naïve café 東京 - ; : ( ) [ ] { }"
).split()
LAST = 8  # the last turns, whose costs are the per-turn figure


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def episode(turns: int, seed: int = 0, words: int = 110) -> list[dict[str, str]]:
    """A system prompt, a task, then ``turns`` times a reply and a tool result of ``words`` words each."""
    rng = random.Random(seed)
    chat = [{"role": "system", "content": "You are an agent. " + _text(rng, 40)}, {"role": "user", "content": "Go."}]
    for _ in range(turns):
        chat.append({"role": "assistant", "content": _text(rng, words)})
        chat.append({"role": "tool", "content": _text(rng, words)})
    return chat


def run_turnkit(fmt: ChatFormat, chat: list[dict[str, str]], replies: list[list[int]]) -> tuple[list[float], float]:
    """Per-turn seconds of add_messages, and the episode's CPU seconds (creation, replies and deltas)."""
    cpu = time.process_time()
    traj = fmt.trajectory(chat[:2])
    per_turn = []
    for number, ids in enumerate(replies):
        traj.add_reply(ids)
        start = time.perf_counter()
        traj.add_messages([chat[3 + 2 * number]])
        per_turn.append(time.perf_counter() - start)
    return per_turn, time.process_time() - cpu


def run_reference(tokenizer, chat: list[dict[str, str]]) -> tuple[list[float], float]:
    """Per-turn seconds of re-rendering and re-encoding the whole history, and the episode's CPU seconds."""
    cpu = time.process_time()
    per_turn = []
    tokenizer.apply_chat_template(chat[:2], add_generation_prompt=True, tokenize=True)
    for end in range(4, len(chat) + 1, 2):
        start = time.perf_counter()
        tokenizer.apply_chat_template(chat[:end], add_generation_prompt=True, tokenize=True)
        per_turn.append(time.perf_counter() - start)
    return per_turn, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", default="8,128,200")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=110)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    folder = smollm2_tokenizer_folder()
    fmt = ChatFormat.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    end = fmt.tokenizer.added["<|im_end|>"].id
    warm = episode(2, seed=1)  # compiled templates, the probe episodes' renders, the tokenizers' caches
    run_turnkit(fmt, warm, [[*fmt.tokenizer.encode(m["content"]).ids, end] for m in warm if m["role"] == "assistant"])
    run_reference(tokenizer, warm)
    print(f"{'turns':>5} {'tokens':>7} | {'turnkit turn':>12} {'reference':>10} {'ratio':>6} | "
          f"{'turnkit CPU':>11} {'reference':>10} {'ratio':>6}")  # fmt: skip
    for turns in (int(n) for n in args.turns.split(",")):
        chat = episode(turns, words=args.words)
        replies = [[*fmt.tokenizer.encode(m["content"]).ids, end] for m in chat if m["role"] == "assistant"]
        tokens = len(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"])
        ours_turn, ours_cpu, ref_turn, ref_cpu = [], [], [], []
        for _ in range(args.rounds):  # the two take turns, so a noisy neighbour slows both alike
            per_turn, cpu = run_turnkit(fmt, chat, replies)
            ours_turn.append(statistics.median(per_turn[-LAST:]))
            ours_cpu.append(cpu)
            per_turn, cpu = run_reference(tokenizer, chat)
            ref_turn.append(statistics.median(per_turn[-LAST:]))
            ref_cpu.append(cpu)
        a, b = statistics.median(ours_turn) * 1e3, statistics.median(ref_turn) * 1e3
        c, d = statistics.median(ours_cpu), statistics.median(ref_cpu)
        per_turn = f"{a:>9.2f} ms {b:>7.2f} ms {b / a:>5.2f}x"
        print(f"{turns:>5} {tokens:>7} | {per_turn} | {c:>9.2f} s {d:>8.2f} s {d / c:>5.2f}x")


if __name__ == "__main__":
    main()
