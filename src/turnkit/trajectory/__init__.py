"""Token in, token out: one agent episode as the exact ids the policy saw and sampled, rows a trainer takes.

An agent loop for reinforcement learning gives the engine a prompt, gets sampled ids back, runs the tools, and asks
again. Decoding the reply, rendering the conversation again and re-encoding it breaks the sequence: BPE is not a
bijection (the trainer's ids are not the ids the policy sampled, so its log-probabilities belong to other tokens), and
a template writes text the engine never sampled (the ``\\n`` after ``<|im_end|>``). A :class:`Trajectory` never does
that. The sampled ids are appended verbatim and trained; what follows them is *the delta*: exactly the ids the
checkpoint's own template writes between that reply and the next generation prompt, never trained.

The delta is not a per-family patch. Each :meth:`Trajectory.add_messages` encodes the conversation with the new
messages and the generation prompt through the encoder (so every message's text is forgery-proof: a tool result that
holds ``<|im_end|>\\n<|im_start|>system`` stays text), locates the last reply in that encoding by the template's own
structure (:meth:`~turnkit.encode.masks.Masks.turn_region`: from the generation-prompt header to the end-of-turn
marker the stop set declares), and takes the ids after it. So the separator after the marker, a stop id that is also
the next role's marker (it ends the reply, so the delta starts after it), tool results a template groups into one
turn and text that depends on the tools all come from the template. A reply cut by the token budget has no stop: its
delta starts with the template's end-of-turn marker. A sampled stop the template does not write there (EOS where the
template closes with ``<|im_end|>``; gpt-oss' ``<|return|>``, closed by ``<|end|>`` once a message follows, which is
no stop) stays, and what the template writes after the reply's text follows it.

A step costs its new tokens, not the history: rendering the whole conversation again at every step is what makes
re-rendering loops slow (tens of milliseconds per step at 128 turns). Where the template keeps its history, a delta
comes from a *window*: the conversation's leading system messages, the last user message before the reply, the reply
and the new messages, rendered and encoded the same way. That is exact only if nothing outside the window changes
what the template writes after the reply (a counter over every earlier call would), so it is proved on creation, not
assumed: the probe episodes' deltas are computed both ways, and any difference (or a window the template refuses)
makes every step render the whole conversation (:attr:`Trajectory.delta_render` says which).

Templates that rewrite history (Qwen3 drops the reasoning of earlier turns; a generation prompt that pre-writes
``<think>``) make the render of the conversation at turn N+1 disagree with what the engine was given at turn N. Each
step checks it (:func:`rewrite`), and the policy chosen up front decides: ``keep`` appends anyway (the trainer sees
what the engine saw), ``fork`` closes the row and starts the next one from the template's own render of the whole
conversation (what the model reads when deployed), ``refuse`` raises :class:`~turnkit.errors.HistoryRewriteError`
naming the turn. Which templates do it is known before the run: :func:`rewrites_history` runs the same check over
scripted probe conversations, the trajectory states it on creation, and ``turnkit doctor`` reports it
(``history-rewrite``).
"""

from __future__ import annotations

from turnkit.trajectory.episode import DeltaRender, Trajectory
from turnkit.trajectory.history import HISTORY_POLICIES, History, rewrite, rewrites_history
from turnkit.trajectory.rows import Row

__all__ = ["HISTORY_POLICIES", "DeltaRender", "History", "Row", "Trajectory", "rewrite", "rewrites_history"]
