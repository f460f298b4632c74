"""``turnkit add-chatml`` and ``turnkit.add_chatml`` on tiny base models made here (examples/base_to_chat/tiny_base.py:
a BPE tokenizer trained on the seed documents, a random Llama, tied and untied), checked with transformers as the
oracle: single special markers, resized rows (old unchanged, new at the mean), the seed's exact ChatML text, EOS in
every file generation reads, a pad that is not the end marker, the base untouched, doctor clean, and every refusal.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
from repo_paths import REPO

pytest.importorskip("transformers")
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

import turnkit
from turnkit import ChatFormat, ChatMLError, doctor, families
from turnkit.chatml import add_chatml_to_folder, chatml_template
from turnkit.cli import main

sys.path.insert(0, str(REPO / "examples" / "base_to_chat"))
from tiny_base import make_base

torch.set_num_threads(1)

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CONVERSATION = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Capital of France?"},
    {"role": "assistant", "content": "Paris"},
    {"role": "user", "content": "And of Italy?"},
]
# Seed 000's render_chatml, written out: every turn <|im_start|>role\ncontent<|im_end|>\n, then the generation prompt.
SEED_TEXT = (
    "<|im_start|>system\nYou answer in one word.<|im_end|>\n"
    "<|im_start|>user\nCapital of France?<|im_end|>\n"
    "<|im_start|>assistant\nParis<|im_end|>\n"
    "<|im_start|>user\nAnd of Italy?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _embedding_and_head(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    weights = load_file(folder / "model.safetensors")
    embedding = weights["model.embed_tokens.weight"]
    return embedding, weights.get("lm_head.weight", embedding)


@pytest.fixture(scope="module", params=["untied", "tied"])
def converted(request, tmp_path_factory):
    """(base, out, what the CLI printed) for an untied and a tied base, converted with the command line."""
    root = tmp_path_factory.mktemp(f"chatml-{request.param}")
    base = make_base(root / "base", tied=request.param == "tied")
    before = _digest(base)
    out = root / "chat"
    code = main(["add-chatml", str(base), "--out", str(out)])
    assert code == 0
    assert _digest(base) == before, "the base folder was modified"
    return base, out, request.param == "tied"


def test_markers_are_single_special_ids(converted):
    base, out, _ = converted
    tokenizer = AutoTokenizer.from_pretrained(out)
    old = AutoTokenizer.from_pretrained(base)
    ids = {marker: tokenizer.convert_tokens_to_ids(marker) for marker in (IM_START, IM_END)}
    for marker, token_id in ids.items():
        assert tokenizer.encode(marker, add_special_tokens=False) == [token_id]
        assert token_id in tokenizer.all_special_ids and token_id >= len(old)
    assert tokenizer.encode("x<|im_end|>\ny", add_special_tokens=False).count(ids[IM_END]) == 1
    assert tokenizer("thanks<|im_end|>", split_special_tokens=True)["input_ids"].count(ids[IM_END]) == 0


def test_rows_resized_old_unchanged_new_at_the_mean(converted):
    base, out, tied = converted
    old_embedding, old_head = _embedding_and_head(base)
    embedding, head = _embedding_and_head(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert embedding.shape[0] == head.shape[0] == len(tokenizer) == old_embedding.shape[0] + 2
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer) and config.get("tie_word_embeddings", True) is tied
    rows = old_embedding.shape[0]
    assert torch.equal(embedding[:rows], old_embedding) and torch.equal(head[:rows], old_head)
    for matrix, old in ((embedding, old_embedding), (head, old_head)):
        mean = old.mean(dim=0)
        for row in matrix[rows:]:
            torch.testing.assert_close(row, mean)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) is tied
    if not tied:
        assert not torch.equal(old_head.mean(dim=0), old_embedding.mean(dim=0))  # the head's own mean, not the input's


def test_template_renders_the_seeds_chatml_exactly(converted):
    _, out, _ = converted
    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert text == SEED_TEXT
    fmt = ChatFormat.from_pretrained(out)
    assert fmt.render(CONVERSATION, add_generation_prompt=True) == SEED_TEXT
    assert families.get("chatml").template and ChatFormat.from_family("chatml").render(CONVERSATION) == fmt.render(
        CONVERSATION
    )
    ids = fmt.encode(CONVERSATION, add_generation_prompt=True).input_ids.tolist()
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_START)) == 5
    assert ids.count(tokenizer.convert_tokens_to_ids(IM_END)) == 4
    assert (out / "chat_template.jinja").read_text() == chatml_template()


def test_eos_everywhere_generation_reads_it_and_pad_is_not_the_end_marker(converted):
    base, out, _ = converted
    tokenizer = AutoTokenizer.from_pretrained(out)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    old_eos = AutoTokenizer.from_pretrained(base).eos_token_id
    assert tokenizer.eos_token == IM_END and tokenizer.eos_token_id == im_end
    for name in ("config.json", "generation_config.json"):
        assert json.loads((out / name).read_text())["eos_token_id"] == [im_end, old_eos], name
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id not in (None, im_end)
    assert json.loads((out / "generation_config.json").read_text())["pad_token_id"] == tokenizer.pad_token_id
    assert set(ChatFormat.from_pretrained(out).stop_ids) >= {im_end, old_eos}


def test_doctor_is_clean_and_lora_names_are_real(converted):
    _, out, _ = converted
    report = doctor.run(out)
    assert report.errors == [] and report.warnings == []
    lora = json.loads((out / "turnkit-lora.json").read_text())
    assert lora["modules_to_save"] == ["embed_tokens", "lm_head"]
    assert (lora["embeddings"], lora["head"]) == ("model.embed_tokens", "lm_head")
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert lora["new_token_ids"] == [tokenizer.convert_tokens_to_ids(IM_START), tokenizer.convert_tokens_to_ids(IM_END)]
    model = AutoModelForCausalLM.from_pretrained(out)
    names = dict(model.named_modules())
    assert names[lora["embeddings"]] is model.get_input_embeddings()
    assert names[lora["head"]] is model.get_output_embeddings()


def test_cli_prints_what_changed(tmp_path, capsys):
    base = make_base(tmp_path / "base", vocab_size=300)
    capsys.readouterr()  # what making the base printed
    code = main(["add-chatml", str(base), "--out", str(tmp_path / "chat"), "--pad-to-multiple-of", "64"])
    out, err = capsys.readouterr()
    assert code == 0, out
    assert "Loading weights" not in err and "%|" not in err  # no loading bars: add-chatml says what it did
    assert "<|im_start|> = 300, <|im_end|> = 301" in out
    assert "vocabulary: 300 -> 302 tokens; embedding rows 300 -> 320" in out
    assert (
        "eos_token_id [301, 0] in config.json and generation_config.json" in out
        and "modules_to_save=['embed_tokens', 'lm_head']" in out
    )
    assert "0 errors, 0 warnings" in out
    embedding, head = _embedding_and_head(tmp_path / "chat")
    assert embedding.shape[0] == head.shape[0] == 320
    assert json.loads((tmp_path / "chat" / "config.json").read_text())["vocab_size"] == 320


def test_python_api_on_objects_system_prompt_and_random_init(tmp_path):
    base = make_base(tmp_path / "base", vocab_size=300)
    model = AutoModelForCausalLM.from_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    old = model.get_input_embeddings().weight.detach().clone()
    system = 'Be brief. It\'s "fine".\nSecond line \\ é'
    changes = turnkit.add_chatml(model, tokenizer, system_prompt=system, init="random")
    assert changes.tokens.added == (IM_START, IM_END) and changes.eos_ids == [301, 0]
    new = model.get_input_embeddings().weight.detach()[300:]
    assert not torch.allclose(new[0], old.mean(dim=0)) and torch.isfinite(new).all()
    assert 0.5 < float(new.std() / old.std()) < 2
    assert model.generation_config.eos_token_id == [301, 0] and model.config.pad_token_id == 0
    messages = [{"role": "user", "content": "hi"}]
    expected = f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == expected
    own = [{"role": "system", "content": "S"}, *messages]
    assert tokenizer.apply_chat_template(own, tokenize=False).startswith("<|im_start|>system\nS<|im_end|>\n")


def test_markers_already_in_the_vocabulary_are_reused(tmp_path):
    base = make_base(tmp_path / "base", vocab_size=300)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_tokens([IM_START])  # there, but not special
    tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(len(tokenizer))
    changes = turnkit.add_chatml(model, tokenizer)
    assert changes.tokens.im_start_id == 300 and changes.tokens.pad_id == 301 and changes.tokens.im_end_id == 302
    assert changes.tokens.added == (IM_END,) and 300 in tokenizer.all_special_ids
    assert changes.weights.old_rows == 302 and changes.weights.new_rows == 303


def test_spare_rows_are_used_and_set_to_the_mean_of_the_known_tokens(tmp_path):
    """A base whose matrix has more rows than tokens (padded for speed): new tokens take spare rows, set to the mean
    of the real tokens' rows; no row is appended and the other spare rows are left alone."""
    base = make_base(tmp_path / "base", vocab_size=300)
    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(320, mean_resizing=False)
    tokenizer = AutoTokenizer.from_pretrained(base)
    before = model.get_output_embeddings().weight.detach().clone()
    changes = turnkit.add_chatml(model, tokenizer)
    head = model.get_output_embeddings().weight.detach()
    assert (changes.weights.old_rows, changes.weights.new_rows, head.shape[0]) == (320, 320, 320)
    assert changes.new_token_ids == [300, 301] == list(changes.weights.initialised)
    for row in (300, 301):
        torch.testing.assert_close(head[row], before[:300].mean(dim=0))
    assert torch.equal(head[:300], before[:300]) and torch.equal(head[302:], before[302:])


def test_the_pad_is_never_the_end_marker(tmp_path):
    base = make_base(tmp_path / "base", vocab_size=300)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_special_tokens({"pad_token": IM_END})  # a pad that would mask every end of turn
    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(len(tokenizer))
    changes = turnkit.add_chatml(model, tokenizer)
    assert changes.tokens.pad_token == "<|endoftext|>" != IM_END


def _refused(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def test_bad_inputs_are_refused_with_the_reason(tmp_path, capsys):
    base = make_base(tmp_path / "base", vocab_size=300)
    out = str(tmp_path / "out")

    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (no_weights / name).write_bytes((base / name).read_bytes())
    assert "has no weights" in _refused(["add-chatml", str(no_weights), "--out", out], capsys)

    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((base / name).read_bytes())
    assert "has no tokenizer" in _refused(["add-chatml", str(no_tokenizer), "--out", out], capsys)

    import gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    err = _refused(["add-chatml", str(path), "--out", out], capsys)
    assert "is a GGUF file" in err and "Hugging Face folder" in err

    assert "does not exist" in _refused(["add-chatml", str(tmp_path / "nowhere"), "--out", out], capsys)

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert "is not empty" in _refused(["add-chatml", str(base), "--out", str(busy)], capsys)
    assert (busy / "notes.txt").read_text() == "mine" and len(list(busy.iterdir())) == 1
    assert "is the base folder" in _refused(["add-chatml", str(base), "--out", str(base)], capsys)
    assert "positive number" in _refused(["add-chatml", str(base), "--out", out, "--pad-to-multiple-of", "0"], capsys)
    assert not Path(out).exists()


def test_another_template_is_refused_unless_forced(tmp_path, capsys):
    base = make_base(tmp_path / "base", vocab_size=300)
    llama3 = families.get("llama3").template
    (base / "chat_template.jinja").write_text(llama3)
    before = _digest(base)
    err = _refused(["add-chatml", str(base), "--out", str(tmp_path / "out")], capsys)
    assert "already has a chat template" in err and "llama3" in err and "--force" in err
    assert not (tmp_path / "out").exists()
    assert main(["add-chatml", str(base), "--out", str(tmp_path / "out"), "--force"]) == 0
    assert (tmp_path / "out" / "chat_template.jinja").read_text() == chatml_template()
    assert _digest(base) == before
    with pytest.raises(ChatMLError, match="already has a chat template"):
        tokenizer = AutoTokenizer.from_pretrained(base)
        turnkit.add_chatml(AutoModelForCausalLM.from_pretrained(base), tokenizer)


def test_converting_twice_changes_nothing_more(converted, tmp_path):
    """add-chatml on its own output: markers reused, no rows added, the same stop ids (the base's EOS still kept)."""
    _, out, _ = converted
    result = add_chatml_to_folder(out, tmp_path / "again")
    assert result.changes.tokens.added == () and result.changes.weights.initialised == ()
    assert result.changes.weights.new_rows == result.changes.weights.old_rows
    for name in ("config.json", "generation_config.json"):
        assert (
            json.loads((tmp_path / "again" / name).read_text())["eos_token_id"]
            == json.loads((out / name).read_text())["eos_token_id"]
        )
    assert result.report.errors == []
    lora = json.loads((tmp_path / "again" / "turnkit-lora.json").read_text())
    assert lora["new_token_ids"] == json.loads((out / "turnkit-lora.json").read_text())["new_token_ids"] != []


def test_an_empty_out_folder_is_used(tmp_path):
    base = make_base(tmp_path / "base", vocab_size=300)
    (tmp_path / "empty").mkdir()
    result = add_chatml_to_folder(base, tmp_path / "empty", system_prompt="Hi.")
    assert result.report.errors == [] and (tmp_path / "empty" / "model.safetensors").is_file()
    assert "Hi." in (tmp_path / "empty" / "chat_template.jinja").read_text()


def test_doctor_flags_a_lora_adapter_on_it_without_modules_to_save(converted, tmp_path):
    """The base already holds the markers, so the adapter adds no token; turnkit-lora.json says their rows are new."""
    peft = pytest.importorskip("peft")
    _, out, tied = converted
    tokenizer = AutoTokenizer.from_pretrained(out)
    lora = json.loads((out / "turnkit-lora.json").read_text())
    assert lora["tied"] is lora["ensure_weight_tying"] is tied
    advised = {"modules_to_save": lora["modules_to_save"], "ensure_weight_tying": lora["ensure_weight_tying"]}
    found = {}
    for name, extra in (("without", {}), ("with", advised)):
        config = peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"], **extra)
        adapter = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(out), config)
        adapter.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
        found[name] = [f.check for f in doctor.run(tmp_path / name).errors]
    assert found == {"without": ["adapter-missing-modules-to-save"], "with": []}
