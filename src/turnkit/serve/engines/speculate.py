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

When it pays, and how long a draft. A verified token is not free, and what it costs depends on the machine and the
model: on this machine kind's CPU, with the embedded model, a step of 2 tokens costs about twice a step of 1, of 5
about three times, of 17 about seven times; on a GPU a few more tokens cost almost nothing. So the engine measures
what its steps cost by their number of tokens (:class:`StepCosts`, shared by every request), and each request's
:class:`Drafter` estimates how likely its drafted tokens are to be accepted (from its verified drafts, and from the
drafts it proposed but did not make, checked for free against the tokens that came). A draft is made only at the
length that gives the most tokens per second at those two estimates, and not at all where no length beats a plain
step: a reply of new text soon stops drafting (its few lookups that match are seldom right), a reply that repeats
its prompt keeps long drafts, and one that stopped drafting starts again as soon as the text it writes runs along
its context again. The engine drafts only while few streams decode (:mod:`.schedule`): a batch of many streams is
already compute-bound.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from turnkit.errors import ServeConfigError

__all__ = ["STEP_COSTS_ENV", "Drafter", "StepCosts"]

#: A test seam: fixed step costs (``TOKENS=SECONDS,...``, e.g. ``1=1.0,2=1.02,17=1.3``) instead of measured ones, so
#: that whether a draft pays follows from the tokens alone, not from how busy the machine is while a test runs (a busy
#: machine rightly measures that drafts do not pay, and makes none). Never needed to serve.
STEP_COSTS_ENV = "TURNKIT_STEP_COSTS"

#: Lookup lengths, longest first: a longer match predicts better, a shorter one finds more (two tokens match all over
#: prose, where drafts are seldom accepted; three already find a copied text again right after an edit in it).
NGRAMS = (6, 4, 3)
#: The per-token acceptance assumed before any evidence, and how fast the estimate forgets. The prior is low: a request
#: drafts only once the proposals it did not make (free evidence) were right a few times in a row, so a reply of new
#: text, whose lookups match now and then but seldom predict, costs nothing, and one that copies its prompt starts
#: drafting after a few tokens.
_PRIOR, _DECAY = 0.5, 0.9
#: Before a step bigger than the plain one was measured, each more token is assumed to cost this share of the plain
#: step: optimistic (a GPU's figure), so that drafting is tried and its real cost measured.
_PRIOR_SLOPE = 0.25
#: Step sizes measured (bigger steps are prompt chunks: no draft ever makes one), and how fast a mean forgets.
_LARGEST, _WEIGHT = 256, 0.3


class StepCosts:
    """What a step costs by its number of tokens: a moving mean of the measured seconds for each size, and for sizes
    not measured yet an estimate from the nearest measured ones."""

    def __init__(self, fixed: Mapping[int, float] | None = None) -> None:
        self._mean: dict[int, float] = dict(fixed or {})
        self._fixed = fixed is not None  # fixed costs: what is measured is not kept

    @classmethod
    def from_environment(cls) -> StepCosts:
        """Measured costs, or the fixed ones of :data:`STEP_COSTS_ENV` where it is set (a test's seam).

        Raises:
            ServeConfigError: the variable is set but is not a list of ``TOKENS=SECONDS`` with positive numbers.
        """
        text = os.environ.get(STEP_COSTS_ENV, "").strip()
        if not text:
            return cls()
        fixed: dict[int, float] = {}
        for item in text.split(","):
            tokens, _, seconds = item.partition("=")
            try:
                size, value = int(tokens), float(seconds)
            except ValueError:
                size, value = 0, 0.0
            if not (0 < size <= _LARGEST and value > 0):
                raise ServeConfigError(
                    f"{STEP_COSTS_ENV}={text!r}: {item.strip()!r} is not TOKENS=SECONDS (a step size from 1 to "
                    f"{_LARGEST} and its positive seconds), e.g. 1=1.0,2=1.02,17=1.3"
                )
            fixed[size] = value
        return cls(fixed)

    def observe(self, tokens: int, seconds: float) -> None:
        """A step of ``tokens`` tokens took ``seconds`` (ignored where the costs are fixed)."""
        if 0 < tokens <= _LARGEST and not self._fixed:
            old = self._mean.get(tokens)
            self._mean[tokens] = seconds if old is None else (1 - _WEIGHT) * old + _WEIGHT * seconds

    def seconds(self, tokens: int) -> float | None:
        """The estimated seconds of a step of ``tokens`` tokens; None before any step at most that big was measured.
        Between two measured sizes: linear; past the biggest: the slope of the two biggest (at least a small share of
        a step a token), or :data:`_PRIOR_SLOPE` while only one size is known."""
        if tokens in self._mean:
            return self._mean[tokens]
        below = [size for size in self._mean if size < tokens]
        if not below:
            return None
        low = max(below)
        above = [size for size in self._mean if size > tokens]
        if above:
            high = min(above)
            share = (tokens - low) / (high - low)
            return self._mean[low] + share * (self._mean[high] - self._mean[low])
        if len(below) == 1:
            return self._mean[low] * (1 + _PRIOR_SLOPE * (tokens - low))
        second = max(size for size in below if size != low)
        slope = (self._mean[low] - self._mean[second]) / (low - second)
        return self._mean[low] + max(slope, 0.02 * self._mean[low]) * (tokens - low)


class Drafter:
    """One request's drafts, from an index of the n-grams of its sequence (grown as tokens come) to where each last
    occurred; ``n_max``: the longest draft."""

    def __init__(self, n_max: int = 16) -> None:
        self.n_max = n_max
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are indexed
        self._hits, self._misses = _PRIOR * 4, (1 - _PRIOR) * 4
        self._shadow: list[int] = []  # a proposal not drafted, to be checked against the token that comes
        self._shadow_at = 0  # the position of its first token
        self.drafted = self.accepted = 0

    def draft(self, known: list[int], room: int, base: int, costs: StepCosts) -> list[int]:
        """At most ``room`` tokens likely to follow ``known`` (the prompt and the reply so far, its last token the
        one about to be fed): what followed the last occurrence of its longest indexed suffix, cut to the length that
        gives the step the most tokens per second (:meth:`_length`). ``base``: the step's tokens without this draft
        (this request's own included). Empty when nothing matches or no draft pays."""
        self._check_shadow(known)
        self._grow(known)
        proposal = self._lookup(known, min(room, self.n_max))
        length = self._length(len(proposal), base, costs) if proposal else 0
        if length == 0:
            self._shadow, self._shadow_at = proposal, len(known)
            return []
        self._shadow = []
        return proposal[:length]

    def verified(self, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens had its first ``accepted`` kept."""
        if not drafted:
            return
        self.drafted += drafted
        self.accepted += accepted
        for _ in range(accepted):
            self._observe(True)
        if accepted < drafted:
            self._observe(False)

    def _observe(self, hit: bool) -> None:
        """One drafted token accepted or not; each observation weighs more than the older ones."""
        self._hits, self._misses = self._hits * _DECAY + hit, self._misses * _DECAY + (not hit)

    def _check_shadow(self, known: list[int]) -> None:
        """The first token of the last proposal not drafted, against the token that came in its place: evidence of
        the acceptance at no cost, so a request that stopped drafting starts again where its text runs along its
        context again."""
        if self._shadow and len(known) > self._shadow_at:
            self._observe(known[self._shadow_at] == self._shadow[0])
        self._shadow = []

    def _lookup(self, known: list[int], room: int) -> list[int]:
        """What followed the last earlier occurrence of the longest suffix of ``known`` that occurred before."""
        if room <= 0:
            return []
        for n in NGRAMS:
            if len(known) > n:
                start = self._index.get(tuple(known[-n:]))
                if start is not None:
                    return known[start : start + room]
        return []

    def _length(self, longest: int, base: int, costs: StepCosts) -> int:
        """The draft length (0: none) that makes the most tokens per second of the step: with per-token acceptance
        ``a`` (each token accepted with that chance, given the ones before it were), a draft of L gives
        (1 - a^(L+1)) / (1 - a) tokens, the sampled one included, where a plain step gives 1; the step's other
        ``base - 1`` tokens give one each. Lengths tried: 1, 2, 4, 8, ... and ``longest``."""
        plain = costs.seconds(base)
        if plain is None:
            return 0  # no step of this size measured yet: a plain one measures it
        rate = self._hits / (self._hits + self._misses)
        best, best_value = 0, base / plain
        for length in _lengths(longest):
            tokens = length + 1 if rate >= 1.0 else (1 - rate ** (length + 1)) / (1 - rate)
            value = (base - 1 + tokens) / (costs.seconds(base + length) or plain)
            if value > best_value:
                best, best_value = length, value
        return best

    def _grow(self, known: list[int]) -> None:
        """Index the n-grams that end before the last token: each maps to the position after it (its continuation,
        which the last token's own suffix never has yet), the latest occurrence winning."""
        end = len(known) - 1
        for position in range(max(self._indexed, 1), end + 1):
            for n in NGRAMS:
                if position >= n:
                    self._index[tuple(known[position - n : position])] = position
        self._indexed = max(self._indexed, end + 1)


def _lengths(longest: int) -> list[int]:
    """Powers of two up to ``longest``, and ``longest`` itself."""
    lengths, length = [], 1
    while length < longest:
        lengths.append(length)
        length *= 2
    return [*lengths, longest] if longest > 0 else []
