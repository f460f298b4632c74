"""Trajectories in the shapes RL trainers take: the rows of :class:`~turnkit.trajectory.Trajectory`, translated.

A trainer gets the ids the policy was given and sampled, never a re-rendered conversation: each function here only
slices a trajectory's row, so what the trainer scores is, id for id, what the engine saw and produced.

* :func:`trl_rollout`: the dict TRL's ``GRPOTrainer`` takes from its ``rollout_func`` seam (the one that accepts ids
  made outside the trainer): ``prompt_ids`` (turn 1's prompt), ``completion_ids`` (every sampled reply and the
  template's deltas between them), ``logprobs`` (the engine's, ``0.0`` on the deltas) and ``env_mask`` (``1`` on the
  sampled ids, ``0`` on the deltas: TRL's tool mask, so only the policy's own tokens carry the loss).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from turnkit.encode.encoding import IGNORE_INDEX
from turnkit.errors import TrajectoryError

if TYPE_CHECKING:
    from turnkit.trajectory import Row, Trajectory

__all__ = ["trl_rollout"]


def trl_rollout(trajectories: Sequence[Trajectory]) -> dict[str, list[Any]]:
    """The output of a TRL ``rollout_func``, one completion per trajectory, in order.

    Each completion runs from the first sampled id to the last (a delta after the last reply is the next prompt,
    which no reply followed, so it is left out and the completion ends on the reply's stop as TRL expects). A
    trajectory forked by ``history="fork"`` holds several rows, which GRPO's groups of one prompt cannot take: it is
    refused, naming it.
    """
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for number, trajectory in enumerate(trajectories):
        rows = trajectory.rows
        if len(rows) != 1:
            raise TrajectoryError(
                f"trajectory {number} has {len(rows)} rows (history='fork' closed a row where the template rewrote "
                "history): a TRL rollout is one completion per prompt; use history='keep' or 'refuse'"
            )
        first, last = _sampled_extent(rows[0], number)
        row = rows[0]
        out["prompt_ids"].append(row.input_ids[:first])
        out["completion_ids"].append(row.input_ids[first:last])
        out["logprobs"].append(row.logprobs[first:last])
        out["env_mask"].append([int(label != IGNORE_INDEX) for label in row.labels[first:last]])
    return out


def _sampled_extent(row: Row, number: int) -> tuple[int, int]:
    """The positions of the first sampled id and just after the last one."""
    sampled = [position for position, label in enumerate(row.labels) if label != IGNORE_INDEX]
    if not sampled:
        raise TrajectoryError(f"trajectory {number} has no sampled ids: add_reply the engine's reply first")
    return sampled[0], sampled[-1] + 1
