"""A tiny base model made here, nothing downloaded: a byte-level BPE tokenizer trained on the seed documents and a
small random Llama. It is a *base* model in every way add-chatml cares about: raw-text vocabulary with one end-of-text
token, no chat markers, no chat template.

The tests (tests/chatml/test_chatml.py) build their bases with this too, tied and untied.
"""

from __future__ import annotations

from pathlib import Path

#: The text the tokenizer learns from: the project's seed documents (../shared/seeds beside the repository).
SEEDS = Path(__file__).resolve().parent.parent.parent.parent / "shared" / "seeds"
END_OF_TEXT = "<|endoftext|>"


def _corpus(seeds: Path) -> list[str]:
    texts = [path.read_text(encoding="utf-8") for path in sorted(seeds.glob("*.txt"))]
    if not texts:  # a checkout without shared/: generated text keeps the example runnable
        texts = [" ".join(f"word{n} {chr(97 + n % 26) * (1 + n % 5)}" for n in range(2000))]
    return texts


def make_base(
    out: str | Path,
    *,
    vocab_size: int = 512,
    tied: bool = False,
    hidden: int = 64,
    layers: int = 2,
    seeds: Path = SEEDS,
    seed: int = 0,
) -> Path:
    """Write a base model folder to ``out``: ``config.json``, ``model.safetensors``, ``generation_config.json``,
    ``tokenizer.json`` and ``tokenizer_config.json`` (EOS and BOS ``<|endoftext|>``, no pad, no chat template)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(seeds), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=END_OF_TEXT, bos_token=END_OF_TEXT)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
