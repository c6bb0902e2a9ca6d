"""Copying first: where the output repeats text the sequence holds, the target verifies the copy, not the model draft.

An answer that repeats its context (an edited function, code from an earlier turn, a quoted line) can be drafted for
free: where the sequence's last :data:`MIN_NGRAM` to :data:`MAX_NGRAM` tokens occur earlier in it
(:func:`~specdec.drafters.prompt_lookup.find_continuation`), what followed them there is a one-hot draft of up to
:data:`MAX_COPY` tokens that costs no draft model, only a wider verification. Prompt lookup under the draft model
(``0.5b<-prompt-lookup``) already copies, but through the model: each copied token is verified by the 0.5B first and
the target sees gamma of them a round. Copying first proposes the copy to the target directly, as many tokens as
Theorem 8 with a free draft (c = 0) favours over the measured pass costs,

    k = argmax (S + E(alpha, k) - 1) / T(N + k),  E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha),

N the tokens the pass feeds besides the copy (one sequence: its one pending token; a batch: every row's), S the tokens
they give (read as N), T the pass time per tokens fed and alpha the copies' own acceptance (an
:class:`~specdec.schedules.AlphaEstimate` from :data:`ALPHA0`), and only where that rate beats the model draft's.
A copy is verified as any other draft: the output is the target's at every temperature.

:class:`CopyAcceptance` learns alpha from what the rounds wrote, for both users: a copy's first token's acceptance
and each later one's apart (a copy is uncertain where it starts, then on track), and a copy found but passed over
checked as well as one proposed, so that copies rejected early do not stop copying for good.

Two users: a hierarchy's top level (``copy+A<-prompt-lookup``, :class:`~specdec.drafters.hierarchical.
SpeculativeDrafter`: the one-sequence engine, a batch's lone row) and a batch's model-drafted rows
(:mod:`specdec.batch.copying`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from specdec.drafters.prompt_lookup import find_continuation
from specdec.schedules import ADAPTIVE_DECAY, AlphaEstimate

#: The shortest suffix match a copy starts from (a lone repeated token is no evidence of a copied stretch).
MIN_NGRAM = 3
#: The longest suffix match looked for.
MAX_NGRAM = 4
#: The most tokens a copy proposes.
MAX_COPY = 32
#: The copies' acceptance before any was verified (in a batch each token's; copying first for one sequence the first
#: token's, and COPY_ALPHA0 each later one's).
ALPHA0 = 0.5
COPY_ALPHA0 = 0.8


def find_copy(sequence: Sequence[int], top: int) -> list[int]:
    """Up to ``top`` tokens that followed the latest earlier occurrence of ``sequence``'s last MAX_NGRAM..MIN_NGRAM
    tokens ([] where none occurs).

    >>> find_copy([1, 2, 3, 4, 5, 9, 2, 3, 4], 3)
    [5, 9, 2]
    >>> find_copy([1, 2, 3, 9, 2, 3], 3)   # two tokens are no evidence
    []
    """
    return find_continuation(sequence, top, MAX_NGRAM, MIN_NGRAM) if top > 0 else []


def copy_tokens(first: float, alpha: float, k: int) -> float:
    """Expected tokens of a round that verifies a copy of k tokens: 1 + first (1 - alpha^k) / (1 - alpha), ``first``
    the chance its first token is accepted, ``alpha`` each later one's (a copy is uncertain where it starts, then on
    track); E(alpha, k) of Equation 1 where first = alpha.

    >>> copy_tokens(0.5, 0.5, 2) == 1 + 0.5 + 0.25
    True
    """
    first, alpha = min(max(first, 0.0), 1.0), min(max(alpha, 0.0), 1 - 1e-6)
    return 1 + first * (1 - alpha ** k) / (1 - alpha)


def best_copy(alpha: float, top: int, seconds: Callable[[int], float | None], fed: int = 1,
              first: float | None = None) -> tuple[int, float]:
    """(k, tokens a second) for the k in 0..top that maximizes (fed - 1 + copy_tokens(first, alpha, k)) /
    seconds(fed + k): the pass that feeds ``fed`` tokens besides the copy gives as many without it (k = 0).
    ``seconds(n)``: a pass over n tokens (None: not known, rate 0); ``first``: the first copied token's acceptance
    (None: alpha, Equation 1's E(alpha, k)).

    >>> k, rate = best_copy(0.9, 16, lambda n: 1.0)   # a pass costs the same at any width: the longest copy
    >>> k, round(rate, 2)
    (16, 8.33)
    >>> best_copy(0.5, 16, lambda n: float(n))   # each token costs its own pass: no copy pays
    (0, 1.0)
    """
    first = alpha if first is None else first

    def rate(k: int) -> float:
        time = seconds(fed + k)
        return (fed - 1 + copy_tokens(first, alpha, k)) / time if time else 0.0

    k = max(range(max(top, 0) + 1), key=rate)
    return k, rate(k)


class CopyAcceptance:
    """How far copies hold, learnt from what the rounds wrote: ``first``, the chance a copy's first token is accepted
    (from :data:`ALPHA0`), and ``later``, each later token's (from :data:`COPY_ALPHA0`), both
    :class:`~specdec.schedules.AlphaEstimate`. Each round the copy found (:meth:`remember`), proposed or passed over,
    is checked against the tokens written after it (:meth:`check`, before the next decision): a one-hot draft's token
    is accepted with probability p(x), the chance the target's token is x, so this reads the same acceptance at every
    temperature, and a copy that would have held teaches it as much as one proposed.

    >>> acc = CopyAcceptance()
    >>> acc.remember(3, [7, 8, 9, 5])
    >>> acc.check([1, 2, 3, 7, 8, 4])   # its first two held, the third did not
    >>> round(acc.first.value, 3) > ALPHA0, acc.later.value < COPY_ALPHA0
    (True, True)
    """

    def __init__(self, decay: float = ADAPTIVE_DECAY):
        self.first = AlphaEstimate(ALPHA0, decay)
        self.later = AlphaEstimate(COPY_ALPHA0, decay)
        self._found: tuple[int, list[int]] | None = None  # (sequence length, tokens) of the last copy found

    def tokens(self, k: int) -> float:
        """Expected tokens of a round that verifies a copy of k tokens (:func:`copy_tokens`)."""
        return copy_tokens(self.first.value, self.later.value, k)

    def best(self, top: int, seconds: Callable[[int], float | None], fed: int = 1) -> tuple[int, float]:
        """:func:`best_copy` at these acceptances."""
        return best_copy(self.later.value, top, seconds, fed, first=self.first.value)

    def remember(self, length: int, copy: list[int]) -> None:
        """The copy found where the sequence was ``length`` tokens long (checked by the next :meth:`check`)."""
        self._found = (length, copy)

    def check(self, sequence: Sequence[int]) -> None:
        """The copy remembered against what the sequence holds past it now (the target's own token last: past a
        proposed copy it checks the copy's next token, so that a short copy still learns how long copies hold)."""
        if self._found is None:
            return
        length, copy = self._found
        self._found = None
        written = list(sequence[length:])
        seen = min(len(written), len(copy))
        agreed = 0
        while agreed < seen and written[agreed] == copy[agreed]:
            agreed += 1
        self.observe(agreed, seen)

    def observe(self, accepted: int, proposed: int) -> None:
        """A copy of ``proposed`` tokens had its first ``accepted`` accepted: its first token's acceptance, then the
        later tokens' (one beta each up to the first rejection)."""
        if proposed <= 0:
            return
        self.first.observe([float(accepted > 0)])
        if accepted > 0:
            self.later.observe([1.0] * (accepted - 1) + ([0.0] if accepted < proposed else []))
