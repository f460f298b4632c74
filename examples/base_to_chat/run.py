"""From a base model to a chat model that stops: add-chatml, prepare, fine-tune, serve, measure.

    python examples/base_to_chat/run.py [--work DIR] [--threads 1]

1. Build a tiny base model here (tiny_base.py: BPE tokenizer trained on the seed documents, random Llama).
2. ``turnkit add-chatml BASE --out CHAT``: markers, mean-initialised rows, template, EOS, doctor clean.
3. A synthetic chat dataset (reply with the word reversed), ``turnkit prepare`` into Parquet shards.
4. Fine-tune with TRL's ``SFTTrainer`` on the shards three ways: full fine-tuning; LoRA with the
   ``modules_to_save`` add-chatml advised (from CHAT/turnkit-lora.json); LoRA without it, the mistake seed 000 warns
   about ("a common reason for a LoRA chat fine-tune that never learns to stop").
   ``turnkit doctor`` reads each LoRA adapter: the one without ``modules_to_save`` is an error.
5. ``turnkit serve`` each result and ask held-out words with the official ``openai`` client, greedy. The stop rate is
   the share of replies that end with ``<|im_end|>`` (finish_reason "stop", not "length").

Why LoRA without ``modules_to_save`` cannot stop here: the new ``<|im_end|>`` row of the head is the mean of the old
rows, so its logit is the mean of all the other logits, never the largest; LoRA never changes that row.

Prints a table and writes ``results.json`` in the work folder (tests/chatml/test_chatml_example.py asserts on it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tiny_base import make_base  # noqa: E402 - beside this script

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def turnkit(*args: str) -> str:
    """Run a turnkit command (the command line's own ``main``, in this process), fail loudly, return its output."""
    import contextlib
    import io

    from turnkit.cli import main as command_line

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = command_line(list(args))
    if code != 0:
        raise SystemExit(f"turnkit {' '.join(args)} failed:\n{out.getvalue()}{err.getvalue()}")
    return out.getvalue()


def words(count: int, rng: random.Random, exclude: Collection[str] = ()) -> list[str]:
    """``count`` distinct random lowercase words of 3 to 6 letters, none of them in ``exclude``."""
    found: list[str] = []
    while len(found) < count:
        word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6)))
        if word not in exclude and word not in found:
            found.append(word)
    return found


def conversation(word: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Reverse: {word}"}]


def write_dataset(path: Path, train: list[str]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for word in train:
            messages = [*conversation(word), {"role": "assistant", "content": word[::-1]}]
            out.write(json.dumps({"messages": messages}) + "\n")
    return path


def fine_tune(chat: Path, shards: Any, out: Path, *, lora: dict[str, Any] | None, epochs: int, threads: int) -> Path:
    """Train on the prepared shards with TRL's SFTTrainer; save a plain folder (LoRA merged) with the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(threads)
    peft_config = None
    if lora is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear", **lora)
    config = SFTConfig(
        output_dir=str(out / "trainer"),
        num_train_epochs=epochs,
        per_device_train_batch_size=16,
        learning_rate=3e-3 if lora is None else 1e-2,
        lr_scheduler_type="constant",
        warmup_steps=0,
        completion_only_loss=True,  # labels: turnkit's mask (assistant content and <|im_end|>), -100 elsewhere
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(chat)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(chat),
        args=config,
        train_dataset=shards,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    model = trainer.model
    if lora is not None:
        adapter = out.with_name(out.name + "-adapter")
        model.save_pretrained(adapter)  # the adapter and the tokenizer together, as seed 000 advises
        tokenizer.save_pretrained(adapter)
        model = model.merge_and_unload()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class Served:
    """``turnkit serve MODEL`` in its own process, started at once (it loads while the next model trains)."""

    def __init__(self, model: Path, *, threads: int) -> None:
        self.model = model
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "turnkit.cli", "serve", "--model", str(model), "--port", str(port)]
        command += ["--threads", str(threads), "--no-ui", "--model-id", model.name]
        self.log = model / "serve.log"
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)

    def stop_rate(self, prompts: list[str]) -> dict[str, Any]:
        """Ask each held-out word with the official openai client, greedy: how many replies end the turn."""
        import httpx
        import openai

        deadline = time.monotonic() + 180
        while True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"turnkit serve did not start:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        client = openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        stopped = correct = 0
        samples = []
        for word in prompts:
            reply = client.chat.completions.create(
                model=self.model.name,
                messages=conversation(word),  # type: ignore[arg-type]
                max_tokens=16,
                temperature=0,
            )
            choice = reply.choices[0]
            stopped += choice.finish_reason == "stop"
            correct += choice.finish_reason == "stop" and choice.message.content == word[::-1]
            samples.append([word, choice.message.content, choice.finish_reason])
        return {"stop_rate": stopped / len(prompts), "exact": correct / len(prompts), "samples": samples[:5]}

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, help="where everything is written (default: a new temporary folder)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for training and serving")
    parser.add_argument("--train", type=int, default=400, help="training conversations")
    parser.add_argument("--heldout", type=int, default=20, help="held-out prompts asked of each model")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    work = args.work or Path(tempfile.mkdtemp(prefix="base_to_chat-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    base = make_base(work / "base")
    chat = work / "chat"
    print(f"$ turnkit add-chatml {base} --out {chat}\n{turnkit('add-chatml', str(base), '--out', str(chat))}")
    advice = json.loads((chat / "turnkit-lora.json").read_text())

    rng = random.Random(0)
    train = words(args.train, rng)
    heldout = words(args.heldout, rng, exclude=set(train))
    data = write_dataset(work / "train.jsonl", train)
    print(turnkit("prepare", str(data), "--model", str(chat), "--out", str(work / "shards")))
    import datasets

    from turnkit import doctor
    from turnkit.doctor.output import format_human

    manifest = json.loads((work / "shards" / "manifest.json").read_text())
    shards = datasets.load_dataset(
        "parquet", data_files=[str(work / "shards" / f) for f in manifest["files"]], split="train"
    )

    variants: dict[str, dict[str, Any] | None] = {
        "full fine-tune": None,
        "LoRA + modules_to_save": {
            "modules_to_save": advice["modules_to_save"],
            **({"ensure_weight_tying": True} if advice["ensure_weight_tying"] else {}),
        },
        "LoRA without modules_to_save": {},
    }
    results: dict[str, Any] = {}
    servers: dict[str, Served] = {}
    try:
        for n, (name, lora) in enumerate(variants.items()):
            tick = time.monotonic()
            model = fine_tune(chat, shards, work / f"model-{n}", lora=lora, epochs=args.epochs, threads=args.threads)
            results[name] = {"train_s": round(time.monotonic() - tick, 1)}
            if lora is not None:  # what turnkit doctor says of the adapter, before anyone serves it
                report = doctor.run(model.with_name(model.name + "-adapter"))
                results[name]["doctor_errors"] = [finding.check for finding in report.errors]
                print(f"$ turnkit doctor {model.name}-adapter\n{format_human(report)}")
            servers[name] = Served(model, threads=args.threads)
        for name, server in servers.items():
            results[name].update(server.stop_rate(heldout))
            print(f"{name}: {results[name]}")
    finally:
        for server in servers.values():
            server.close()

    print(f"\n{'variant':<32} {'stop rate':>9} {'exact':>6}   (held-out prompts: {len(heldout)})")
    for name, result in results.items():
        print(f"{name:<32} {result['stop_rate']:>9.0%} {result['exact']:>6.0%}")
    summary = {"results": results, "heldout": len(heldout), "seconds": round(time.monotonic() - started, 1)}
    (work / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{work / 'results.json'} ({summary['seconds']} s)")
    return summary


if __name__ == "__main__":
    main()
