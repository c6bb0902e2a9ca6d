"""Predicted Outputs: the text a caller expects back (the file being edited, the function being rewritten) as an
exact draft, in front of the configured one (OpenAI's ``prediction: {"type": "content", "content": ...}``).

Each round the output so far is aligned with the predicted tokens: where its last tokens occur in the prediction
(the longest match of up to ``MAX_MATCH`` of them, at least ``MIN_MATCH``; of equal ones the first at or after
where the last round left off, so that a repeated line keeps its order), the tokens that follow there are
proposed, many at once where the prediction has been right (:meth:`PredictionDrafter.reach`: it costs no draft
model, only a wider verification). A rejected token leaves the output off the prediction until its last tokens
occur in it again: an inserted line is drafted by copying from the context or written by the target's own steps
(up to ``YOUNG`` tokens; a longer insertion by the configured draft, whose catch-up a short one does not repay),
and where the output rejoins the prediction (the line after it, the rest of a changed name) the prediction drafts
again: within a few tokens of where the output left it a match of one or two tokens is enough
(:meth:`PredictionDrafter.resync`), its first proposal there short until confirmed. There the
prediction learns the edit: the stretch the output wrote in place of the predicted one is spliced in, and, where
it is short, made wherever the same text comes again (a renamed function's later calls, its docstring's
examples), so that an edit made once is drafted, not departed from, the next time. Proposals are one-hot drafts
verified like any other, so the output is the target's at every temperature.

    drafter = PredictionDrafter(target.encode(text, add_special=False), inner=model_drafter)
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.drafters.base import Draft, DraftContext, Drafter, DrafterStats, InFront
from specdec.drafters.prompt_lookup import PromptLookupDrafter

MAX_MATCH = 12  # the longest output suffix compared with the prediction
MIN_MATCH = 3  # a shorter common run is no evidence of where the output is (a lone "(" or newline)
MAX_REACH = 48  # tokens proposed at most in one round
FIRST_REACH = 16  # before the prediction has been checked
# before this generation has timed its own passes: a pass over k tokens costs PASS_COST(k) one-token passes (the
# int4-mixed 1.5B, AVX-512 EPYC, 2026-12-01: 33.4 / 31.5 / 60.7 / 106.7 / 153.9 / 203.6 ms at k = 1 / 4 / 16 / 32 /
# 48 / 64; docs/predicted_outputs.md)
PASS_COST_BASE, PASS_COST_PER_TOKEN = 0.4, 0.089
MEASURED_SPAN = 8  # this generation's timed passes decide once their sizes span this many tokens
RESYNC_WINDOW = 8  # after a departure, two matching tokens this close after where it left re-synchronise,
LONE_WINDOW = 3  # one this close (an insertion, a short change: a lone indent further on is no evidence)
RESYNC_REACH = 8  # the first proposal after such a short match proposes at most this many
EDIT_CONTEXT = 2  # tokens before a departure that place a learned edit (a renamed name's last pieces)
MAX_EDIT = 16  # a learned edit this short (each side) is made wherever its text comes again
# tokens off the prediction drafted by prompt lookup (or none) before the configured draft drafts: a short insertion
# (a guard statement, 15-20 tokens) costs a model draft its catch-up feed (0.5-0.7 s on the AMX Xeon) and rounds
# slower than the target's own steps; measured in docs/predicted_outputs.md
YOUNG = 24
# the prediction's per-token acceptance before it has been checked: an edit departs from it once or twice in 100-700
# tokens (docs/predicted_outputs.md); 0.95 held the first proposals at 7-26 tokens after an early departure
ALPHA_PRIOR, ALPHA_WEIGHT = 0.99, 10


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
    found = _match(output, prediction, anchor)
    return None if found is None else found[0]


def _match(output: Sequence[int], prediction: Sequence[int], anchor: int) -> tuple[int, int] | None:
    """:func:`align`'s (end, length of the matched output suffix)."""
    n_out, n_pred = len(output), len(prediction)
    if n_out == 0:
        return (0, 0) if n_pred else None
    for size in range(min(MAX_MATCH, n_out, n_pred), 0, -1):
        if size < MIN_MATCH and size < n_out:
            break  # (a short output may match with all of itself)
        tail = list(output[n_out - size:])
        ends = [i + size for i in range(n_pred - size + 1) if list(prediction[i: i + size]) == tail]
        if ends:
            after = [e for e in ends if e >= anchor]
            return (after[0] if after else ends[-1]), size
    return None


def replace_all(tokens: Sequence[int], old: Sequence[int], new: Sequence[int]) -> list[int]:
    """``tokens`` with every occurrence of ``old`` (left to right, not overlapping) replaced by ``new``.

    >>> replace_all([1, 2, 3, 1, 2], [1, 2], [1, 2, 9])
    [1, 2, 9, 3, 1, 2, 9]
    """
    old, out, i = list(old), [], 0
    while i < len(tokens):
        if old and list(tokens[i: i + len(old)]) == old:
            out += new
            i += len(old)
        else:
            out.append(tokens[i])
            i += 1
    return out


class PredictionDrafter(InFront):
    """The prediction's tokens where the output is aligned with it, ``inner`` (the configured draft; None:
    nothing) elsewhere. Counts what it proposed and what was accepted (OpenAI's accepted_prediction_tokens and
    rejected_prediction_tokens: :meth:`report`)."""

    def __init__(self, prediction: Sequence[int], inner: Drafter | None = None):
        self.original = [int(t) for t in prediction]
        self.inner = inner
        self.name = "prediction" if inner is None else f"prediction+{inner.name}"
        self._reset()

    def _reset(self) -> None:
        from specdec.schedules import DecayedTimes

        self.passes = DecayedTimes()  # tokens a verification pass fed -> its seconds (this generation's own)
        self.prediction = list(self.original)  # (edited as the output departs from it and rejoins: _rejoin)
        self.anchor = 0  # where in the prediction the output stood after the last round
        # (prediction index, output index) where the output left the prediction, until it rejoins; None: on it
        self.left: tuple[int, int] | None = None
        self._round: tuple[int, int, int] | None = None  # (position in the prediction, tokens proposed, output
        # length) of this round
        self.proposed = self.accepted = self.rounds = self.departures = self.edits = 0
        self.alpha = ALPHA_PRIOR  # the prediction's per-token acceptance: accepted / (accepted + departures)
        self._inner_started = self._from_lookup = False
        self._passes_seen = 0
        self.resynced = False  # the output rejoined the prediction on one or two tokens, not yet confirmed

    @property
    def inner(self) -> Drafter | None:
        return self._inner

    @inner.setter
    def inner(self, drafter: Drafter | None) -> None:
        """A draft put in front of after the start (a batch row going on alone) has been started by its owner."""
        self._inner = drafter
        self._inner_started = drafter is not None and getattr(self, "context", None) is not None

    def stats(self) -> DrafterStats:
        return self._inner.stats() if self._inner is not None and self._inner_started else DrafterStats()

    def start(self, context: DraftContext) -> None:
        super().start(context)
        self.prompt_length = len(context.prompt_ids) if not context.source_ids else 0
        self._reset()  # (the configured draft starts when it first drafts: on an edit the prediction may do it all)
        self.lookup = PromptLookupDrafter()
        self.lookup.start(context)

    def _position(self, sequence: Sequence[int]) -> int | None:
        output = sequence[self.prompt_length:]
        found = self.resync(output) if self.left is not None else None
        if found is None:
            found = _match(output, self.prediction, self.anchor)
            if found is not None and self.left is not None:
                found = self._rejoin(output, *found)
        at = None if found is None else found[0]
        return at if at is not None and at < len(self.prediction) else None

    def resync(self, output: Sequence[int]) -> tuple[int, int] | None:
        """Off the prediction: (end, size) where the output's last one or two tokens, written since it left,
        occur within :data:`RESYNC_WINDOW` tokens after where it left (the rest of a changed name, the token after
        an inserted one), learned as an edit (:meth:`_rejoin`); None: not there."""
        at, since = self.left  # type: ignore[misc]
        off = len(output) - since  # tokens written since the output left (the target's own first)
        for size, window in ((2, RESYNC_WINDOW), (1, LONE_WINDOW)):
            if size > off:
                continue
            tail = list(output[len(output) - size:])
            for i in range(at, min(at + window, len(self.prediction) - size + 1)):
                if self.prediction[i: i + size] == tail:
                    return self._rejoin(output, i + size, size)
        return None

    def _rejoin(self, output: Sequence[int], end: int, size: int) -> tuple[int, int]:
        """The output, off the prediction since ``self.left``, rejoins it: its last ``size`` tokens are the
        prediction's up to ``end``. What it wrote in place of the predicted stretch is spliced into the prediction
        (which then holds the output's text there: later alignment finds this place first), and a short edit
        (each side at most :data:`MAX_EDIT` tokens, placed by the :data:`EDIT_CONTEXT` tokens before it) is made
        wherever its text comes again after it. Returns the (end, size) in the edited prediction."""
        at, since = self.left  # type: ignore[misc]
        self.left = None
        self.resynced = True  # (its first proposal is short until the target confirms it)
        start, written = end - size, len(output) - size  # the stretches replaced: prediction[at:start], output[since:written]
        if start < at or written < since:  # (the match reaches back before the departure: nothing to learn)
            return end, size
        context = min(EDIT_CONTEXT, at, since)
        old, new = self.prediction[at - context: start], list(output[since - context: written])
        rest = self.prediction[start:]
        if context == EDIT_CONTEXT and old != new and len(old) - context <= MAX_EDIT and len(new) - context <= MAX_EDIT:
            rest = replace_all(rest, old, new)
            self.edits += 1
        self.prediction = self.prediction[: at - context] + new + rest
        end += len(new) - len(old)
        self.anchor = end
        return end, size

    def observe_pass(self, tokens: int, seconds: float) -> None:
        """A verification pass of this generation fed ``tokens`` tokens in ``seconds`` (the loop tells it). The
        first is not kept: it carries the generation's first-pass costs (a batch row's first pass alone after its
        prefill took 2x its width's time), and a size proposed once is not timed again when the line through
        it says shorter proposals pay."""
        self._passes_seen += 1
        if tokens > 0 and seconds > 0 and self._passes_seen > 1:
            self.passes.observe(tokens, seconds)
        if self._inner_started and (observe := getattr(self._inner, "observe_pass", None)) is not None:
            observe(tokens, seconds)  # (a draft that copies first times its passes too)

    def pass_cost(self, tokens: int) -> float:
        """A pass over ``tokens`` tokens in one-token passes: from this generation's own timed passes (the line
        through them) once they span :data:`MEASURED_SPAN` sizes or more (a line through neighbouring sizes is
        their noise), else :data:`PASS_COST_BASE` + :data:`PASS_COST_PER_TOKEN` k."""
        line, one = self.passes.line(0), self.passes.line(1)
        spanned = len(self.passes) >= 2 and max(self.passes) - min(self.passes) >= MEASURED_SPAN
        if spanned and line is not None and one is not None and one[0] > 0:
            return max(1.0, (line[0] + line[1] * tokens) / one[0])
        return max(1.0, PASS_COST_BASE + PASS_COST_PER_TOKEN * tokens)

    def _young(self, sequence: Sequence[int]) -> bool:
        """Off the prediction for at most :data:`YOUNG` tokens (copying or the target's own steps write them)."""
        return self.left is not None and len(sequence) - self.prompt_length - self.left[1] <= YOUNG

    def reach(self, sequence: Sequence[int], gamma: int) -> int:
        """How many tokens to propose this round, given the schedule's ``gamma``: with the output on the prediction,
        the k Theorem 8 favours when a draft costs nothing (c = 0): the most expected tokens, E(alpha, k) =
        (1 - alpha^(k+1)) / (1 - alpha), per the cost of a pass over k + 1 tokens (:meth:`pass_cost`), at the
        prediction's recent per-token acceptance alpha; off it, the configured draft's (its :meth:`reach` where it
        has one: copying first, else ``gamma``)."""
        at = self._position(sequence)
        if at is None:
            drafts = self._inner_started and not self._young(sequence)
            inner_reach = getattr(self._inner, "reach", None) if drafts else None
            return inner_reach(sequence, gamma) if inner_reach is not None else gamma
        if not self.rounds:
            return max(gamma, FIRST_REACH)
        alpha = min(self.alpha, 0.999)

        def rate(k: int) -> float:
            return (1 - alpha ** (k + 1)) / (1 - alpha) / self.pass_cost(k + 1)

        best = max(range(1, MAX_REACH + 1), key=rate)
        return max(gamma, min(best, RESYNC_REACH) if self.resynced else best)

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        at = self._position(sequence) if k > 0 else None
        if at is not None:
            run = self.prediction[at: at + k]
            self._round = (at, len(run), len(sequence) - self.prompt_length)
            self.rounds += 1
            self.proposed += len(run)
            draft = Draft.from_ids(run, self.context.device)
            draft.source = "prediction"  # (the playground colours what the target accepted of it)
            return draft
        self._round = None
        self._from_lookup = False
        if self.inner is None or k <= 0:  # (no draft configured: nothing; a batch row: the batch's draft drafts)
            return Draft.empty(self.context.device)
        if self._young(sequence):
            # just off the prediction (a changed name, a comment added): copying from the context, free, or a plain
            # step, until the output rejoins it; only a longer departure (new text) pays for the draft model
            self._from_lookup = True
            return self.lookup.propose(sequence, k)
        if not self._inner_started:
            self.inner.start(self.context)
            self._inner_started = True
        return self.inner.propose(sequence, k)

    def update(self, n_accepted: int) -> None:
        if self._round is not None:
            at, size, written = self._round
            self.resynced = False
            self.accepted += n_accepted
            self.anchor = at + n_accepted  # (where the target's own token stands: on or off the prediction)
            if n_accepted < size:  # the target's token departs from the prediction there
                self.left = (at + n_accepted, written + n_accepted)
                self.departures += 1
            self.alpha = ((self.accepted + ALPHA_PRIOR * ALPHA_WEIGHT)
                          / (self.accepted + self.departures + ALPHA_WEIGHT))
        elif self._inner is not None and self._inner_started and not self._from_lookup:
            self.inner.update(n_accepted)
        self._round = None

    def report(self) -> dict[str, int]:
        """OpenAI's counts: accepted_prediction_tokens (proposed from the prediction and accepted) and
        rejected_prediction_tokens (proposed from it and not); with the rounds that proposed from it."""
        return {"accepted_prediction_tokens": self.accepted, "rejected_prediction_tokens": self.proposed - self.accepted,
                "prediction_rounds": self.rounds, "prediction_tokens": len(self.original), "prediction_edits": self.edits}



def with_prediction(drafter: Any, prediction: Sequence[int] | None) -> Any:
    """``drafter`` behind ``prediction`` (None or empty: ``drafter`` as it is)."""
    if not prediction:
        return drafter
    return PredictionDrafter(prediction, drafter)
