"""Speculative decoding from the context (prompt lookup): drafts taken from n-grams of the prompt and the reply so far.

Why. Agents spend much of their time having a model rewrite what it was just shown: a file with a few changes, a
function moved, a command repeated. Such a reply repeats long runs of its prompt, and the next tokens of a run can be
guessed without a model: find the last few tokens earlier in the sequence and propose what followed them there. The
engine feeds the last sampled token and the draft in one batch (a batch of k tokens costs much less than k
one-token steps) and keeps drafted tokens while they are what the request would have produced anyway.

Exactness. At every drafted position the request's own sampler is asked, with its logits, exactly as it would have been
without the draft and in the same state (penalty counts, the grammar, its random generator: one draw per token
either way), until the first pick that differs from the draft, which is kept in its place; the rest of the draft is
dropped (and its cache cells freed). So greedy replies are the same token ids, a seeded sampled reply is the same
reply with speculation on or off, and stop ids, ``max_tokens``, log-probabilities, grammars, stop strings and the
stream parser see the same tokens. For sampled replies this is standard speculative sampling (Leviathan et al.,
2023) with the draft as a point mass q on d: their rule accepts d with probability min(1, p(d)/q(d)) = p(d) and
otherwise draws from the residual max(0, p - q), i.e. p without d, renormalized; drawing t from p and accepting
iff t == d has the same two outcomes with the same probabilities.

When it pays. A verified token is not free: on a CPU it costs about what a prompt token does, which for a small model
is much of a one-token step (the embedded model on this machine kind: a batch of 2 costs about twice one token on one
thread, 17 tokens about six times on two). Whether drafting pays therefore depends on the machine, the model and the
text, so each :class:`Drafter` measures it for its own request: the seconds per token it got from steps with a draft
against steps without one (:meth:`Drafter.timed`, from the engine's step times). It drafts only where the context
has a match, sizes its drafts from the acceptance it has seen (longer while drafts are accepted), and rests (drafts
nothing for a while, then tries again) when a draft was rejected whole or when drafting was slower than not: a reply
that repeats its prompt keeps long drafts where they pay, a reply of new text soon stops drafting. The engine drafts
only while few streams decode (:mod:`.schedule`): a batch of many streams is already compute-bound.
"""

from __future__ import annotations

import math

__all__ = ["Drafter"]

#: Lookup lengths, longest first: a longer match predicts better, a shorter one finds more (two tokens match all over
#: prose, where drafts are seldom accepted; three already find a copied text again right after an edit in it).
NGRAMS = (6, 4, 3)
#: A draft is cut where the estimated chance that the whole of it is accepted falls under this.
_WHOLE = 0.5
#: The per-token acceptance assumed before any draft was verified, and how fast the estimate forgets.
_PRIOR, _DECAY = 0.85, 0.9


class Drafter:
    """One request's drafts, from an index of the n-grams of its sequence (grown as tokens come) to where each last
    occurred; ``n_max``: the longest draft."""

    def __init__(self, n_max: int = 16) -> None:
        self.n_max = n_max
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are indexed
        self._hits, self._misses = _PRIOR * 4, (1 - _PRIOR) * 4
        self._rest_until = 0  # no drafts before the sequence reaches this length
        self._rest = 8
        self._plain: float | None = None  # seconds per token of steps without a draft (a moving average)
        self._drafting: float | None = None  # and of steps with one
        self.drafted = self.accepted = 0

    def draft(self, known: list[int], room: int) -> list[int]:
        """At most ``room`` tokens likely to follow ``known`` (the prompt and the reply so far, its last token the
        one about to be fed): what followed the last occurrence of its longest indexed suffix. Empty when nothing
        matches, or while resting."""
        self._grow(known)
        length = min(room, self._length())
        if length <= 0 or len(known) < self._rest_until or self._plain is None:
            return []  # resting, or no plain step measured yet to compare with
        if self._drafting is not None and self._drafting > self._plain:
            self._resting(len(known))  # drafting was slower than not: rest, then measure both again
            self._plain = self._drafting = None
            return []
        for n in NGRAMS:
            if len(known) > n:
                start = self._index.get(tuple(known[-n:]))
                if start is not None:
                    return known[start : start + length]
        return []

    def verified(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens had its first ``accepted`` kept: update the acceptance estimate, and rest
        after a draft nothing of which was kept."""
        if not drafted:
            return
        self.drafted += drafted
        self.accepted += accepted
        for _ in range(accepted):  # each verified token one observation, the older ones weighing less
            self._hits, self._misses = self._hits * _DECAY + 1, self._misses * _DECAY
        if accepted < drafted:
            self._hits, self._misses = self._hits * _DECAY, self._misses * _DECAY + 1
        if accepted == 0:
            self._resting(self._indexed)
        else:
            self._rest = 8

    def timed(self, seconds: float, tokens: int, drafted: bool) -> None:
        """A step took ``seconds`` and gave this request ``tokens`` tokens, with a draft or without one."""
        per_token = seconds / max(1, tokens)
        if drafted:
            self._drafting = per_token if self._drafting is None else 0.7 * self._drafting + 0.3 * per_token
        else:
            self._plain = per_token if self._plain is None else 0.7 * self._plain + 0.3 * per_token

    def _resting(self, length: int) -> None:
        """No drafts for the next ``_rest`` tokens (8, doubling while drafting keeps failing, at most 256)."""
        self._rest_until = length + self._rest
        self._rest = min(256, self._rest * 2)

    def _length(self) -> int:
        """The longest draft whose whole acceptance is at least :data:`_WHOLE` likely, at the estimated per-token
        acceptance rate (each token accepted with that chance, given the ones before it were)."""
        rate = self._hits / (self._hits + self._misses)
        if rate >= 1.0:
            return self.n_max
        return min(self.n_max, max(1, int(math.log(_WHOLE) / math.log(rate))))

    def _grow(self, known: list[int]) -> None:
        """Index the n-grams that end before the last token: each maps to the position after it (its continuation,
        which the last token's own suffix never has yet), the latest occurrence winning."""
        end = len(known) - 1
        for position in range(max(self._indexed, 1), end + 1):
            for n in NGRAMS:
                if position >= n:
                    self._index[tuple(known[position - n : position])] = position
        self._indexed = max(self._indexed, end + 1)
