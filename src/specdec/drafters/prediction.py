"""Predicted Outputs: the text a caller expects back (the file being edited, the function being rewritten) as an
exact draft, in front of the configured one (OpenAI's ``prediction: {"type": "content", "content": ...}``).

Each round the output so far is aligned with the predicted tokens: where its last tokens occur in the prediction
(the longest match of up to ``MAX_MATCH`` of them, at least ``MIN_MATCH``; of equal ones the first at or after
where the last round left off, so that a repeated line keeps its order), the tokens that follow there are
proposed, many at once where the prediction has been right (:meth:`PredictionDrafter.reach`: it costs no draft
model, only a wider verification). A rejected token leaves the output off the prediction until its last tokens
occur in it again: an inserted line is drafted by the configured draft, and where the output rejoins the
prediction (the line after it, the rest of a changed name) the prediction drafts again. Proposals are one-hot
drafts verified like any other, so the output is the target's at every temperature.

    drafter = PredictionDrafter(target.encode(text, add_special=False), inner=model_drafter)
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.drafters.base import Draft, DraftContext, Drafter, InFront

MAX_MATCH = 12  # the longest output suffix compared with the prediction
MIN_MATCH = 3  # a shorter common run is no evidence of where the output is (a lone "(" or newline)
MAX_REACH = 48  # tokens proposed at most in one round
FIRST_REACH = 16  # before the prediction has been checked
# before this generation has timed its own passes: a pass over k tokens costs PASS_COST(k) one-token passes (the
# int4-mixed 1.5B, AVX-512 EPYC, 2026-12-01: 33.4 / 31.5 / 60.7 / 106.7 / 153.9 / 203.6 ms at k = 1 / 4 / 16 / 32 /
# 48 / 64; docs/predicted_outputs.md)
PASS_COST_BASE, PASS_COST_PER_TOKEN = 0.4, 0.089


def align(output: Sequence[int], prediction: Sequence[int], anchor: int = 0) -> int | None:
    """Where in ``prediction`` the token after ``output`` is expected: the end of the longest occurrence of an
    output suffix (``MIN_MATCH`` to ``MAX_MATCH`` tokens; fewer while the output is shorter, down to the empty one:
    an empty output stands at the prediction's start); of equally long occurrences the first ending at or after
    ``anchor`` (where the last round left off), else the last one before it. None: no suffix occurs.

    >>> align([5, 6, 7], [1, 5, 6, 7, 8])
    4
    >>> align([9, 9, 9], [1, 2, 3]) is None
    True
    """
    n_out, n_pred = len(output), len(prediction)
    if n_out == 0:
        return 0 if n_pred else None
    for size in range(min(MAX_MATCH, n_out, n_pred), 0, -1):
        if size < MIN_MATCH and size < n_out:
            break  # (a short output may match with all of itself)
        tail = list(output[n_out - size:])
        ends = [i + size for i in range(n_pred - size + 1) if list(prediction[i: i + size]) == tail]
        if ends:
            after = [e for e in ends if e >= anchor]
            return after[0] if after else ends[-1]
    return None


class PredictionDrafter(InFront):
    """The prediction's tokens where the output is aligned with it, ``inner`` (the configured draft; None:
    nothing) elsewhere. Counts what it proposed and what was accepted (OpenAI's accepted_prediction_tokens and
    rejected_prediction_tokens: :meth:`report`)."""

    def __init__(self, prediction: Sequence[int], inner: Drafter | None = None):
        self.prediction = [int(t) for t in prediction]
        self.inner = inner
        self.name = "prediction" if inner is None else f"prediction+{inner.name}"
        self._reset()

    def _reset(self) -> None:
        from specdec.schedules import DecayedTimes

        self.passes = DecayedTimes()  # tokens a verification pass fed -> its seconds (this generation's own)
        self.anchor = 0  # where in the prediction the output stood after the last round
        self._round: tuple[int, int] | None = None  # (position in the prediction, tokens proposed) of this round
        self.proposed = self.accepted = self.rounds = 0
        self.alpha = 0.9  # the prediction's recent per-token acceptance (a decayed estimate)

    def start(self, context: DraftContext) -> None:
        super().start(context)
        self.prompt_length = len(context.prompt_ids) if not context.source_ids else 0
        if self.inner is not None:
            self.inner.start(context)
        self._reset()

    def _position(self, sequence: Sequence[int]) -> int | None:
        output = sequence[self.prompt_length:]
        at = align(output, self.prediction, self.anchor)
        return at if at is not None and at < len(self.prediction) else None

    def observe_pass(self, tokens: int, seconds: float) -> None:
        """A verification pass of this generation fed ``tokens`` tokens in ``seconds`` (the loop tells it)."""
        if tokens > 0 and seconds > 0:
            self.passes.observe(tokens, seconds)

    def pass_cost(self, tokens: int) -> float:
        """A pass over ``tokens`` tokens in one-token passes: from this generation's own timed passes (the line
        through them) once it has timed two sizes, else :data:`PASS_COST_BASE` + :data:`PASS_COST_PER_TOKEN` k."""
        line, one = self.passes.line(0), self.passes.line(1)
        if line is not None and one is not None and one[0] > 0:
            return max(1.0, (line[0] + line[1] * tokens) / one[0])
        return max(1.0, PASS_COST_BASE + PASS_COST_PER_TOKEN * tokens)

    def reach(self, sequence: Sequence[int], gamma: int) -> int:
        """How many tokens to propose this round, given the schedule's ``gamma``: with the output on the prediction,
        the k Theorem 8 favours when a draft costs nothing (c = 0): the most expected tokens, E(alpha, k) =
        (1 - alpha^(k+1)) / (1 - alpha), per the cost of a pass over k + 1 tokens (:meth:`pass_cost`), at the
        prediction's recent per-token acceptance alpha; off it, ``gamma`` (the configured draft's)."""
        at = self._position(sequence)
        if at is None:
            return gamma
        if not self.rounds:
            return max(gamma, FIRST_REACH)
        alpha = min(self.alpha, 0.999)

        def rate(k: int) -> float:
            return (1 - alpha ** (k + 1)) / (1 - alpha) / self.pass_cost(k + 1)

        return max(gamma, max(range(1, MAX_REACH + 1), key=rate))

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        at = self._position(sequence) if k > 0 else None
        if at is not None:
            run = self.prediction[at: at + k]
            self._round = (at, len(run))
            self.rounds += 1
            self.proposed += len(run)
            draft = Draft.from_ids(run, self.context.device)
            draft.source = "prediction"  # (the playground colours what the target accepted of it)
            return draft
        self._round = None
        if self.inner is None or k <= 0:
            return Draft.empty(self.context.device)
        return self.inner.propose(sequence, k)

    def update(self, n_accepted: int) -> None:
        if self._round is not None:
            at, size = self._round
            self.accepted += n_accepted
            self.anchor = at + n_accepted  # (where the target's own token stands: on or off the prediction)
            observed = n_accepted / size if n_accepted == size else n_accepted / (n_accepted + 1)
            self.alpha = 0.7 * self.alpha + 0.3 * observed
        elif self.inner is not None:
            self.inner.update(n_accepted)
        self._round = None

    def report(self) -> dict[str, int]:
        """OpenAI's counts: accepted_prediction_tokens (proposed from the prediction and accepted) and
        rejected_prediction_tokens (proposed from it and not); with the rounds that proposed from it."""
        return {"accepted_prediction_tokens": self.accepted, "rejected_prediction_tokens": self.proposed - self.accepted,
                "prediction_rounds": self.rounds, "prediction_tokens": len(self.prediction)}



def with_prediction(drafter: Any, prediction: Sequence[int] | None) -> Any:
    """``drafter`` behind ``prediction`` (None or empty: ``drafter`` as it is)."""
    if not prediction:
        return drafter
    return PredictionDrafter(prediction, drafter)
