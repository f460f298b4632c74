"""TRL's GRPOTrainer trains a multi-turn policy through turnkit trajectories (``rollout_func``, the seam that takes
ids made outside the trainer): the embedded SmolLM2 (its weights converted from the GGUF) samples each reply, a tool
answers, the trajectory appends the template's delta, and :func:`turnkit.trainers.trl_rollout` hands the rows over.
The trainer's ids are the policy's ids, and only the sampled ones carry the loss."""

from __future__ import annotations

import math

import pytest

from turnkit import ChatFormat, TrajectoryError
from turnkit.trainers import trl_rollout

pytestmark = pytest.mark.slow

TURNS = 2  # replies per episode: a tool result between them


@pytest.fixture(scope="module")
def policy_folder(smollm2_gguf):
    pytest.importorskip("trl")
    from turnkit.serve.engines.torch import _converted_gguf

    return _converted_gguf(smollm2_gguf)


def _sample(model, fmt: ChatFormat, prompt_ids: list[int], max_new_tokens: int = 12) -> tuple[list[int], list[float]]:
    """The policy's reply to ``prompt_ids`` and each sampled id's log-probability, stopping on the template's stops."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(fmt.stop_ids),
            pad_token_id=sorted(fmt.stop_ids)[0],
            output_scores=True,
            return_dict_in_generate=True,
        )
        scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
    ids = out.sequences[0, len(prompt_ids) :].tolist()
    return ids, scores[0, : len(ids)].tolist()


def test_grpo_trains_on_the_trajectories_ids(policy_folder, smollm2_hf_folder, tmp_path):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    fmt = ChatFormat.from_pretrained(smollm2_hf_folder)  # the GGUF's tokenizer and template; the weights converted
    episodes: list = []  # every rollout's trajectories, in the order the trainer asked
    handed: list[list[int]] = []  # the completion ids the trainer scored, as its reward function saw them

    def rollout(prompts, trainer):
        trajectories = []
        for prompt in prompts:  # the sampler repeats each prompt num_generations times: one episode each
            traj = fmt.trajectory(prompt)
            for turn in range(TURNS):
                ids, logprobs = _sample(trainer.model, fmt, traj.prompt_ids)
                traj.add_reply(ids, logprobs=logprobs)
                if turn + 1 < TURNS:
                    traj.add_messages([{"role": "tool", "content": "sunny, 21 degrees"}])
            trajectories.append(traj)
        episodes.append(trajectories)
        return trl_rollout(trajectories)

    def reward(completion_ids, **kwargs):
        handed.extend(list(ids) for ids in completion_ids)
        return [float(len(ids) % 5) for ids in completion_ids]  # any spread: GRPO needs different rewards

    prompts = [[{"role": "user", "content": f"What is the weather in city {n}?"}] for n in range(4)]
    config = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=2,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=64,
        learning_rate=1e-5,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,  # TRL's default on a CPU autocasts to bf16, casting every weight at each call: twice the time
        logging_steps=1,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy_folder),
        reward_funcs=reward,
        args=config,
        train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=AutoTokenizer.from_pretrained(smollm2_hf_folder),
        rollout_func=rollout,
    )
    result = trainer.train()
    assert result.global_step == 2 and math.isfinite(result.training_loss)

    trajectories = [traj for batch in episodes for traj in batch]
    assert trajectories and len(handed) == len(trajectories)
    for traj, completion in zip(trajectories, handed, strict=True):
        (row,) = traj.rows
        start = len(row.input_ids) - len(completion) - _after_last_reply(row)
        assert row.input_ids[start : start + len(completion)] == completion  # the trainer's ids are the policy's
    # only the sampled ids carry the loss: the tool turn's delta is masked out
    rollout_out = trl_rollout(trajectories[:1])
    mask, ids = rollout_out["env_mask"][0], rollout_out["completion_ids"][0]
    delta = [i for i, m in zip(ids, mask, strict=True) if m == 0]
    assert "sunny, 21 degrees" in fmt.tokenizer.decode(delta) and sum(mask) == len(ids) - len(delta)


def _after_last_reply(row) -> int:
    """Ids after the last sampled one (none: an episode here ends on a reply)."""
    last = max(i for i, label in enumerate(row.labels) if label != -100)
    return len(row.input_ids) - last - 1


def test_a_forked_trajectory_is_refused_by_name(smollm2_hf_folder):
    fmt = ChatFormat.from_pretrained(smollm2_hf_folder).with_template(
        "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
        "{% if message.reasoning_content and loop.last %}{{ '<think>' + message.reasoning_content + '</think>' }}"
        "{% endif %}{{ message['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    end = fmt.tokenizer.added["<|im_end|>"].id
    traj = fmt.trajectory([{"role": "user", "content": "Is 7 prime?"}], history="fork")
    traj.add_reply([*fmt.tokenizer.encode("<think>Yes.</think>Yes.").ids, end])
    traj.add_messages([{"role": "user", "content": "And 9?"}])
    assert len(traj.rows) == 2
    kept = fmt.trajectory([{"role": "user", "content": "Hi"}])
    kept.add_reply([*fmt.tokenizer.encode("Hello.").ids, end])
    assert trl_rollout([kept])["env_mask"] == [[1] * (len(fmt.tokenizer.encode("Hello.").ids) + 1)]
    with pytest.raises(TrajectoryError, match="trajectory 1 has 2 rows"):
        trl_rollout([kept, traj])
    with pytest.raises(TrajectoryError, match="trajectory 0 has no sampled ids"):
        trl_rollout([fmt.trajectory([{"role": "user", "content": "Hi"}])])
