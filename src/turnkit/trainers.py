"""Trajectories in the shapes RL trainers take: the rows of :class:`~turnkit.trajectory.Trajectory`, translated.

A trainer gets the ids the policy was given and sampled, never a re-rendered conversation: each function here only
slices a trajectory's row, so what the trainer scores is, id for id, what the engine saw and produced.

* :func:`trl_rollout`: the dict TRL's ``GRPOTrainer`` takes from its ``rollout_func`` seam (the one that accepts ids
  made outside the trainer): ``prompt_ids`` (turn 1's prompt), ``completion_ids`` (every sampled reply and the
  template's deltas between them), ``logprobs`` (the engine's, ``0.0`` on the deltas) and ``env_mask`` (``1`` on the
  sampled ids, ``0`` on the deltas: TRL's tool mask, so only the policy's own tokens carry the loss).
* :class:`ContinuousTokenBuilder`: verl's Continuous Token builder interface as verl 0.9.1's agent loop calls it
  (``build_initial_tokens``, ``merge_assistant_tokens``, ``merge_context_tokens``, ``align_response_metadata``,
  ``supports_multimodal``, returning a :class:`MergeResult` of verl's shape), each merge a step of a trajectory, so
  the ids verl's agent loop holds are the ones a trajectory makes for any template, with no per-family subclass.
  ``tests/test_trainers_verl.py`` runs it inside verl's own agent-loop methods where verl imports.
* :func:`skyrl_output`: SkyRL's ``GeneratorOutput`` (``prompt_token_ids``, ``response_ids``, ``loss_masks``,
  ``rollout_logprobs``, ``stop_reasons``, the rest ``None``), what a SkyRL generator returns. SkyRL does not import
  on Python 3.11 (0.4.0 requires 3.12; 0.3.0's ``skyrl.backends`` fails in pydantic): the keys are its 0.4.0
  TypedDict's, read from its source.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from turnkit.encode.encoding import IGNORE_INDEX
from turnkit.errors import TrajectoryError

if TYPE_CHECKING:
    from turnkit.format import ChatFormat
    from turnkit.trajectory import Row, Trajectory

__all__ = ["ContinuousTokenBuilder", "MergeResult", "skyrl_output", "trl_rollout"]


def trl_rollout(trajectories: Sequence[Trajectory]) -> dict[str, list[Any]]:
    """The output of a TRL ``rollout_func``, one completion per trajectory, in order.

    Each completion runs from the first sampled id to the last (a delta after the last reply is the next prompt,
    which no reply followed, so it is left out and the completion ends on the reply's stop as TRL expects). A
    trajectory forked by ``history="fork"`` holds several rows, which GRPO's groups of one prompt cannot take: it is
    refused, naming it.
    """
    out: dict[str, list[Any]] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for episode in _episodes(trajectories, "a TRL rollout is one completion per prompt"):
        out["prompt_ids"].append(episode.prompt_ids)
        out["completion_ids"].append(episode.response_ids)
        out["logprobs"].append(episode.logprobs)
        out["env_mask"].append(episode.mask)
    return out


def skyrl_output(trajectories: Sequence[Trajectory], rewards: Sequence[float | Sequence[float]]) -> dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` (what a ``GeneratorInterface.generate`` returns), one entry per trajectory, in
    order: ``prompt_token_ids``, ``response_ids`` (as :func:`trl_rollout`'s completion), ``loss_masks`` (1 on the
    sampled ids), ``rollout_logprobs``, ``rewards`` as given, and ``stop_reasons`` (each episode's last reply's finish
    reason). Every key of SkyRL 0.4.0's ``GeneratorOutput`` TypedDict is written (a TypedDict's keys are all required;
    its trainer indexes some it does not fill, ``trajectory_ids``, ``is_last_step``), those turnkit has no value for
    ``None``."""
    episodes = _episodes(trajectories, "a SkyRL generator output is one response per prompt")
    if len(rewards) != len(episodes):
        raise TrajectoryError(f"{len(rewards)} rewards for {len(episodes)} trajectories")
    return {
        "prompt_token_ids": [e.prompt_ids for e in episodes],
        "response_ids": [e.response_ids for e in episodes],
        "rewards": list(rewards),
        "loss_masks": [e.mask for e in episodes],
        "stop_reasons": [t.finish_reasons[-1] for t in trajectories],
        "rollout_metrics": None,
        "rollout_logprobs": [e.logprobs for e in episodes],
        "trajectory_ids": None,
        "trajectory_generation_times": None,
        "trajectory_time_splits": None,
        "rollout_expert_indices": None,
        "rollout_sample_support": None,
        "is_last_step": None,
        "env_metrics": None,
        "pixel_values": None,
        "image_grid_thw": None,
    }


@dataclass(frozen=True)
class _Episode:
    """One trajectory's row cut where trainers cut it: the first prompt, then the first sampled id to the last."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    mask: list[int]


def _episodes(trajectories: Sequence[Trajectory], why_one_row: str) -> list[_Episode]:
    out = []
    for number, trajectory in enumerate(trajectories):
        rows = trajectory.rows
        if len(rows) != 1:
            raise TrajectoryError(
                f"trajectory {number} has {len(rows)} rows (history='fork' closed a row where the template rewrote "
                f"history): {why_one_row}; use history='keep' or 'refuse'"
            )
        (row,) = rows
        first, last = _sampled_extent(row, number)
        mask = [int(label != IGNORE_INDEX) for label in row.labels[first:last]]
        out.append(_Episode(row.input_ids[:first], row.input_ids[first:last], row.logprobs[first:last], mask))
    return out


def _sampled_extent(row: Row, number: int) -> tuple[int, int]:
    """The positions of the first sampled id and just after the last one."""
    sampled = [position for position, label in enumerate(row.labels) if label != IGNORE_INDEX]
    if not sampled:
        raise TrajectoryError(f"trajectory {number} has no sampled ids: add_reply the engine's reply first")
    return sampled[0], sampled[-1] + 1


MergeKind = Literal["assistant", "context"]


@dataclass(frozen=True)
class MergeResult:
    """verl's ``MergeResult``: the runtime ids after a merge and how they changed at the junction. turnkit's deltas
    are the template's own ids (what follows a sampled stop, or the end-of-turn marker a cut reply lacks), so nothing
    is inserted or removed beside them: ``inserted_token_ids`` is empty and ``removed_prefix_token_count`` 0."""

    token_ids: list[int]
    appended_token_count: int
    kind: MergeKind = "context"
    inserted_token_ids: list[int] = field(default_factory=list)
    removed_prefix_token_count: int = 0


class ContinuousTokenBuilder:
    """verl's Continuous Token builder on turnkit trajectories: one builder for any template and many episodes.

    verl's agent loop (0.9.1's ``AgentLoopBase``: ``ct_build_initial_tokens``, ``ct_merge_context_msg``,
    ``ct_merge_assistant_token``) takes it in place of the builder it makes itself
    (``agent_loop.continuous_token_builder = ContinuousTokenBuilder(fmt)``) and calls it with the ids it holds
    (``runtime_token_ids``); each episode is found by those ids, which must be the ids the builder's last step gave
    that episode (a mismatch is an error naming it, never a silent re-render). ``history`` is the trajectories' policy
    for templates that rewrite history: ``"keep"`` or ``"refuse"`` (``"fork"`` starts a new row, which a merge of
    appended ids cannot express). The last ``episodes`` episodes are kept; :meth:`trajectory` gives an episode's
    trajectory (its rows, its rewrites).
    """

    def __init__(
        self,
        fmt: ChatFormat,
        *,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        history: Literal["keep", "refuse"] = "keep",
        episodes: int = 4096,
    ) -> None:
        if history not in ("keep", "refuse"):
            raise ValueError(f"history must be 'keep' or 'refuse' for verl's merges, not {history!r}")
        self.fmt = fmt
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.history = history
        self._limit = episodes
        self._episodes: OrderedDict[tuple[int, ...], Trajectory] = OrderedDict()

    @classmethod
    def supports_multimodal(cls) -> bool:
        """verl asks before a rollout with images, videos or audio: trajectories hold text only."""
        return False

    def build_initial_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        images: list[Any] | None = None,
        videos: list[Any] | None = None,
        audios: list[Any] | None = None,
        mm_inputs_out: dict[str, Any] | None = None,
    ) -> list[int]:
        """An episode's first prompt: the conversation with the generation prompt, forgery-proof. verl's agent loop
        passes its media arguments always (``None`` for text): any media is refused, naming it."""
        del mm_inputs_out  # filled by verl's multimodal builders only
        media = [name for name, given in (("images", images), ("videos", videos), ("audios", audios)) if given]
        if media:
            raise TrajectoryError(f"build_initial_tokens: {', '.join(media)} given; trajectories hold text only")
        traj = self.fmt.trajectory(messages, tools=tools, history=self.history, **self.chat_template_kwargs)
        ids = traj.prompt_ids
        self._keep(ids, traj)
        return ids

    def merge_assistant_tokens(self, runtime_token_ids: list[int], assistant_token_ids: list[int]) -> MergeResult:
        """The engine's sampled ids appended as they are (the trajectory reads the reply from them)."""
        traj = self._episode(runtime_token_ids, "merge_assistant_tokens")
        traj.add_reply(assistant_token_ids)
        merged = [*runtime_token_ids, *assistant_token_ids]
        self._keep(merged, traj)
        return MergeResult(merged, len(assistant_token_ids), "assistant")

    def merge_context_tokens(
        self,
        previous_messages: list[dict[str, Any]],
        updated_messages: list[dict[str, Any]],
        runtime_token_ids: list[int],
        *,
        tools: list[dict[str, Any]] | None = None,
    ) -> MergeResult:
        """The messages ``updated_messages`` appends to ``previous_messages`` (tool results, a user turn), as the ids
        the template writes after the last reply up to the next generation prompt. ``tools`` are the episode's,
        given to :meth:`build_initial_tokens`."""
        traj = self._episode(runtime_token_ids, "merge_context_tokens")
        if tools is not None and list(tools) != list(traj.tools or []):
            self._keep(runtime_token_ids, traj)
            raise TrajectoryError("merge_context_tokens: tools differ from the episode's (build_initial_tokens)")
        if len(updated_messages) < len(previous_messages) or updated_messages[: len(previous_messages)] != list(
            previous_messages
        ):
            self._keep(runtime_token_ids, traj)
            raise TrajectoryError(
                "merge_context_tokens: updated_messages must be previous_messages with messages appended"
            )
        delta = traj.add_messages(updated_messages[len(previous_messages) :])
        merged = [*runtime_token_ids, *delta]
        self._keep(merged, traj)
        return MergeResult(merged, len(delta), "context")

    def align_response_metadata(
        self,
        merge_result: MergeResult,
        response_mask: list[int],
        response_logprobs: list[float] | None = None,
        *,
        assistant_logprobs: list[float] | None = None,
    ) -> tuple[list[int], list[float] | None]:
        """The response mask and log-probabilities after a merge: 1 and the engine's on sampled ids, 0 and 0.0 on
        what the template wrote."""
        mask = list(response_mask)
        logprobs = None if response_logprobs is None else list(response_logprobs)
        if logprobs is None and assistant_logprobs is not None:
            raise TrajectoryError("align_response_metadata: assistant_logprobs needs response_logprobs")
        if merge_result.removed_prefix_token_count:
            mask = mask[: -merge_result.removed_prefix_token_count]
            logprobs = None if logprobs is None else logprobs[: -merge_result.removed_prefix_token_count]
        count = len(merge_result.inserted_token_ids)
        mask += [0] * count
        if logprobs is not None:
            logprobs += [0.0] * count
        count = merge_result.appended_token_count
        if merge_result.kind == "assistant":
            mask += [1] * count
            if logprobs is not None:
                given = list(assistant_logprobs or [])
                if len(given) != count:
                    raise TrajectoryError(
                        f"align_response_metadata: {len(given)} assistant log-probabilities for {count} sampled ids"
                    )
                logprobs += given
        else:
            mask += [0] * count
            if logprobs is not None:
                logprobs += [0.0] * count
        return mask, logprobs

    def trajectory(self, runtime_token_ids: list[int]) -> Trajectory:
        """The trajectory of the episode whose ids these are (its rows, the messages as read, its rewrites)."""
        return self._episode(runtime_token_ids, "trajectory", keep=True)

    def _episode(self, runtime_token_ids: list[int], step: str, *, keep: bool = False) -> Trajectory:
        key = tuple(int(i) for i in runtime_token_ids)
        traj = self._episodes.get(key) if keep else self._episodes.pop(key, None)
        if traj is None:
            raise TrajectoryError(
                f"{step}: these {len(key)} runtime ids are no episode's: build_initial_tokens starts one, and each "
                "merge continues from the token_ids the last merge returned"
            )
        return traj

    def _keep(self, ids: list[int], traj: Trajectory) -> None:
        self._episodes[tuple(ids)] = traj
        while len(self._episodes) > self._limit:
            self._episodes.popitem(last=False)
