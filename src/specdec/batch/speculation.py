"""How many tokens the rows of a batch (:mod:`specdec.batch.engine`) draft: Theorem 8 over the batch's measured costs.

One row's speculation gains what Theorem 8 says; B rows share a target pass over B (gamma + 1) tokens, which on a CPU
costs much more than one over B tokens once reading the weights no longer bounds it, and the batch's draft step costs
more than a lone row's. So with ``speculation="measured"`` (the default) each model-drafted row of a batch of two rows
or more drafts at most the batch's gamma (:class:`BatchGamma`), from the pass times per tokens fed and the draft step
per batch size it measures (timed at startup by :func:`calibrate`, then from every round), and a joining row's draft
is fed its prompt only where the batch drafts at the size it is about to have (:func:`draft_prefills`) and where
drafting is likely to save more than the feeding costs over the tokens the row will generate
(:meth:`BatchGamma.feed_pays`; a row whose draft was not fed runs plain, :func:`idle_rows`); a row's alpha starts
from the batch's pooled one and ages toward it while its draft proposes nothing (:func:`settle_alphas`). A lone row
runs through the one-sequence engine (:mod:`specdec.batch.alone`) and drafts as :func:`specdec.generate` would.
docs/serving.md ("Speculation that follows the load") has the measurements behind each rule.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.analysis import expected_tokens
from specdec.batch.drafting import CATCH_UP
from specdec.batch.row import MODEL
from specdec.schedules import (ADAPTIVE_ALPHA0, ADAPTIVE_DECAY, ADAPTIVE_PROBE_EVERY, AlphaEstimate, DecayedTimes,
                               StepFeedback)

#: How many tokens the model-drafted rows of a batch of two rows or more draft (``speculation=``; a lone row drafts as
#: :func:`specdec.generate` would, :mod:`specdec.batch.alone`):
SPECULATION = {
    # the default: each row's gamma at most the batch's, Theorem 8 over the batch's measured costs (a target pass
    # over B (gamma + 1) tokens, a draft step of B rows; :class:`BatchGamma`): fewer drafts, or none, as rows are added
    "measured": "at most the gamma Theorem 8 gives for the batch's measured costs",
    # the draft model drafts, per batch size, while its rounds' measured tokens a second beat plain rounds'
    "gate": "drafting or plain rounds, whichever measured faster at this batch size (specdec.batch.gate)",
    # every row as its schedule says, every round: a sampled row then draws exactly what it draws alone
    "rows": "each row's own schedule, every round",
}

#: The batch drafts only where Theorem 8 over its measured costs gives this much more than plain rounds: what the
#: model leaves out (the draft's catch-ups after plain rounds, each drafting row's sampling and verification)
#: measured through specdec serve at 8 clients, where a predicted gain of a few percent was a loss
BATCH_MARGIN = 0.1
#: Weight of the past in the batch's pooled alpha (every model-drafted row's betas) and in its mean output length:
#: slower than a row's own (ADAPTIVE_DECAY), it is the prior of rows that join and of rows whose draft sat idle
POOLED_DECAY = 0.97
#: Feeding a row's draft what it lacks must save this many times its cost (BatchGamma.feed_pays): the expected saving
#: comes from Theorem 8 at the pooled alpha, which at 2 rows on chat (the CPU default pair, 2 cores) predicted a
#: drafting round 1.30x a plain one where the rounds measured 1.14x (acceptance comes in runs, and each drafting row
#: adds its sampling and verification)
FEED_MARGIN = 2.0
#: Before any request finished, the share of what a row may still generate (its max_tokens left) that it is taken to
#: generate (:meth:`BatchGamma.tokens_left`): requests stop before their limit (chat answers: 68 of 192 on average
#: through the serve bench); counting the whole limit, a fresh server fed its first requests' drafts where a warm one
#: does not (2 chat clients on a fresh server: 0.93x plain batching, 1.08x after a completion workload)
COLD_OUTPUT_SHARE = 0.5
#: Drafting rounds at a batch size before what they gave can overrule Theorem 8 there (:meth:`BatchGamma.vetoes`):
#: in one process, 4 completions at once, gamma 2 chosen at 3 rows gave 45-48 tokens a second against plain rounds'
#: 47-49 (the pooled alpha over-stated these rows', and their drafts' catch-ups are not in the model), and the
#: rows' copies at 3 rows 39-43 against plain's 45-49
REALIZED_ROUNDS = 4
#: Plain rounds at a batch size after such a veto before drafting is tried there afresh
REALIZED_RETRY = 64


class BatchGamma:
    """The gamma of a batch (:mod:`specdec.batch.engine`) from its measured costs: Theorem 8 with the batch's
    verification cost.

    Each model-drafted row keeps its alpha (an :class:`AlphaEstimate` as the one-sequence schedule's), and the
    batch keeps the time of a draft step per batch size and of a target pass per number of tokens it feeds (rows x
    width; the tokens themselves where the sequences are packed without padding, :attr:`packed`), through
    :class:`DecayedTimes` as the one-sequence schedule's, read piecewise linearly (:meth:`DecayedTimes.at`). Each
    round it drafts the gamma that maximizes the batch's expected tokens per second,

        sum_i E_i(gamma) / (gamma D(B) + T(B (gamma + 1))),  E_i(gamma) = (1 - alpha_i^(gamma+1)) / (1 - alpha_i),

    gamma = 0 (plain steps, B tokens per pass) included: with enough rows (a pass over B x (gamma + 1) tokens
    costing more than the accepted drafts gain) it drafts less, or nothing. Unlike the one-sequence schedule it
    does not probe while nothing pays: a probe after plain rounds first feeds the draft every token it missed
    (about 3.5 ms a token for the 0.5B on 2 cores, a sixth of what a plain pass of 7 rows costs a token), and plain
    is the side that cannot lose; it drafts again where its measured costs say so (the plain pass it keeps timing
    grows with the rows' lengths; fewer rows). T(B), plain decoding's pass, is timed at each batch size before it
    decides there (a round of gamma 0), and again every ``probe_every`` rounds; until two pass sizes and a draft
    step have been timed it drafts ``gamma``. ``decided`` keeps the last gamma chosen per batch size (a joining
    row's draft prefills only where it is not 0)."""

    def __init__(self, gamma: int, max_gamma: int, decay: float = ADAPTIVE_DECAY, alpha0: float = ADAPTIVE_ALPHA0,
                 probe_every: int = ADAPTIVE_PROBE_EVERY):
        self.gamma, self.max_gamma, self.decay, self.alpha0 = gamma, max_gamma, decay, alpha0
        self.target_time = DecayedTimes(decay)  # tokens fed -> averaged seconds
        self.draft_time = DecayedTimes(decay)  # rows -> averaged seconds of one draft step
        self.decided: dict[int, int] = {}  # rows -> the gamma last chosen for that many rows
        self.packed = False  # whether the target's passes are packed (no padding: BatchSession.packed)
        self.probe_every = probe_every
        self._since_plain: dict[int, int] = {}  # rows -> rounds since a plain pass of that many rows was timed
        self._drafted_before: bool | None = None  # did the previous round draft? (None: no round yet)
        self.pooled = AlphaEstimate(alpha0, POOLED_DECAY)  # every model-drafted row's betas: a joining row's prior
        self._outputs = (0.0, 0.0)  # decayed sum of the tokens finished requests generated, and their decayed count
        self.feed_seconds: float | None = None  # decayed seconds the draft model takes per prompt token it is fed
        # (rows, drafted) -> [decayed tokens, decayed seconds, rounds] of whole batched rounds (observe_round)
        self._realized: dict[tuple[int, bool], list[float]] = {}
        self._vetoed: dict[int, int] = {}  # rows -> plain rounds while drafting there was overruled

    def observe(self, rows: int, width: int, time_target: float, drafted: int, time_draft: float,
                tokens: int | None = None) -> None:
        """A round of ``rows`` rows whose target pass fed ``width`` tokens per row (``tokens`` in all where its
        sequences were packed: :attr:`packed`); ``drafted``: the most tokens a row drafted (draft steps), in
        ``time_draft`` seconds. As the one-sequence schedule, a round after
        one that did not draft is not a draft step's time: its draft first caught up with the plain rounds' tokens
        (counted, a draft step of 2 rows measured 1.39 target steps, 0.56 without them, and the batch stopped drafting
        where drafting paid: docs/serving.md)."""
        if time_target > 0:
            self.target_time.observe(rows * width if tokens is None else tokens, time_target)
        if drafted > 0 and time_draft > 0 and self._drafted_before:
            self.draft_time.observe(rows, time_draft / drafted)
        self._drafted_before = drafted > 0

    def observe_round(self, rows: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A whole batched round of ``rows`` rows that drafted (the model or copies) or not: every row's new tokens
        over the round's wall time (the draft's steps and catch-ups, the pass, sampling and verification). A plain
        round where drafting is overruled (:meth:`vetoes`) counts toward trying it afresh: after
        :data:`REALIZED_RETRY` of them its drafting rounds are forgotten."""
        if seconds <= 0:
            return
        side = self._realized.setdefault((rows, drafted), [0.0, 0.0, 0])
        side[0] = self.decay * side[0] + tokens
        side[1] = self.decay * side[1] + seconds
        side[2] += 1
        if not drafted and self.vetoes(rows):
            self._vetoed[rows] = self._vetoed.get(rows, 0) + 1
            if self._vetoed[rows] >= REALIZED_RETRY:
                del self._realized[(rows, True)]
                self._vetoed[rows] = 0

    def realized(self, rows: int, drafted: bool) -> float | None:
        """The decayed tokens a second of the rounds at ``rows`` rows that drafted (or not); None before any."""
        side = self._realized.get((rows, drafted))
        return side[0] / side[1] if side and side[1] > 0 else None

    def realized_sides(self) -> list[tuple[int, bool]]:
        """The (rows, drafted) sides :meth:`observe_round` has seen."""
        return list(self._realized)

    def vetoes(self, rows: int) -> bool:
        """Whether drafting (the model's, the copies') at ``rows`` rows is overruled: its last
        :data:`REALIZED_ROUNDS` or more rounds gave fewer tokens a second than plain rounds there (measured the same
        way; before one was, ``rows`` over the timed plain pass). Theorem 8 predicts from the step costs and the
        rows' acceptance; this is what the rounds gave."""
        side = self._realized.get((rows, True))
        plain = self.realized(rows, False)
        if plain is None and self.target_time.get(rows):
            plain = rows / self.target_time[rows]
        return side is not None and side[2] >= REALIZED_ROUNDS and plain is not None and side[0] / side[1] < plain

    def finished(self, tokens: int) -> None:
        """A request finished after generating ``tokens`` tokens (how long the next ones are likely to run)."""
        total, count = self._outputs
        self._outputs = (POOLED_DECAY * total + tokens, POOLED_DECAY * count + 1)

    @property
    def output_tokens(self) -> float | None:
        """The decayed mean of the tokens finished requests generated; None before one finished."""
        total, count = self._outputs
        return total / count if count else None

    def observe_feed(self, tokens: int, seconds: float) -> None:
        """The draft model was fed ``tokens`` prompt tokens (a joining row's prefill, a catch-up) in ``seconds``."""
        if tokens > 0 and seconds > 0:
            per = seconds / tokens
            last = self.feed_seconds
            self.feed_seconds = per if last is None else self.decay * last + (1 - self.decay) * per

    def feed_saving(self, rows: int) -> float | None:
        """Seconds a generated token costs less where ``rows`` rows of the pooled alpha draft at the batch's best
        gamma than in plain rounds, ``1 / r_0 - 1 / r_gamma`` (Theorem 8 over the measured costs; 0.0 where the batch
        would not draft); None before a feed and the batch's costs have been timed. The same for every row of a
        round: :func:`idle_rows` reads it once."""
        if self.feed_seconds is None or len(self.target_time) < 2 or not self.draft_time:
            return None
        alphas = [self.pooled.value] * rows
        best = self._best(alphas, rows, self.max_gamma)
        if best == 0:
            return 0.0
        return 1 / self.expected_rate(alphas, rows, 0) - 1 / self.expected_rate(alphas, rows, best)

    def feed_pays(self, rows: int, feed: int, left: int, generated: int = 0,
                  saving: float | None = None) -> bool | None:
        """Whether feeding a row's draft ``feed`` tokens it lacks (its prompt as it joins a batch of ``rows``
        rows, a catch-up) pays for itself: the time drafting saves over the tokens the row is likely still to
        generate, ``n`` times :meth:`feed_saving` (``saving`` where the caller has it), against ``feed`` times the
        measured seconds a fed token costs. n is ``left`` at most; where requests have finished, what a request of
        their mean length m has left after the ``generated`` tokens of this one, at least m / 4. On 2 cores the 0.5B
        is fed a prompt at a third of the 1.5B's prefill time, and at 2 rows drafting saves about 7 ms a token: a
        chat answer of 70 tokens does not pay for a 340-token prompt. It must save FEED_MARGIN times the cost. None
        before a feed and the batch's costs have been timed (the caller's rule applies)."""
        saving = self.feed_saving(rows) if saving is None else saving
        if saving is None:
            return None
        if saving <= 0:
            return False
        return self.tokens_left(left, generated) * saving >= FEED_MARGIN * feed * self.feed_seconds

    def tokens_left(self, left: int, generated: int) -> float:
        """The tokens a row that has generated ``generated`` (and may generate ``left`` more) is likely still to
        generate: what a request of the finished ones' mean length m has left, at least m / 4, at most ``left``.
        Before a request finished, half of ``left`` (COLD_OUTPUT_SHARE)."""
        mean = self.output_tokens
        return COLD_OUTPUT_SHARE * left if mean is None else min(left, max(mean - generated, mean / 4))

    def expected_rate(self, alphas: Sequence[float], rows: int, gamma: int) -> float | None:
        """Theorem 8 for the batch: expected tokens a second of ``rows`` rows (those with ``alphas`` drafting
        ``gamma`` tokens, the others plain) from the measured costs; None before they are measured."""
        if not self.draft_time:
            return None
        step = self.draft_time.get(rows) or self.draft_time[min(self.draft_time, key=lambda r: abs(r - rows))]
        # a packed pass feeds each drafting row gamma + 1 tokens and each other row 1; a padded one every row gamma + 1
        fed = len(alphas) * (gamma + 1) + rows - len(alphas) if self.packed else rows * (gamma + 1)
        seconds = self.target_time.at(fed)
        if seconds is None:
            return None
        tokens = sum(expected_tokens(min(max(al, 0.0), 1 - 1e-6), gamma) for al in alphas) + rows - len(alphas)
        return tokens / (gamma * step + seconds)

    def choose(self, alphas: Sequence[float], rows: int | None = None, max_gamma: int | None = None) -> int:
        """The batch's gamma for the rows with these alphas, in a batch of ``rows`` rows (default: those; the
        others' tokens per pass do not depend on this gamma), at most ``max_gamma`` (default: the policy's)."""
        rows = len(alphas) if rows is None else rows
        top = self.max_gamma if max_gamma is None else max_gamma
        since = self._since_plain.get(rows)
        if rows not in self.target_time or (since is not None and since >= self.probe_every):
            # plain decoding's own pass at this batch size, timed (not read off larger passes: a pass over fewer
            # tokens can cost much less), and again every probe_every rounds (its time grows with the rows' lengths)
            self._since_plain[rows] = 0
            return 0
        self._since_plain[rows] = (since or 0) + 1
        if len(self.target_time) < 2 or not self.draft_time:
            best = min(self.gamma, top)
        else:
            best = self._best(alphas, rows, top)
            if best > 0 and self.vetoes(rows):  # (what drafting rounds gave here, measured, overrules the model)
                best = 0
        self.decided[rows] = best
        return best

    def row(self) -> "RowAlpha":
        """An adaptive row's schedule: its alpha, its gamma the batch's."""
        return RowAlpha(self)

    def drafts_at(self, rows: int) -> bool:
        """Whether the batch drafts at ``rows`` rows: the last gamma chosen there, else what the measured costs
        predict for rows of the prior alpha (False before any are measured)."""
        if rows in self.decided:
            return self.decided[rows] > 0
        if len(self.target_time) < 2 or not self.draft_time:
            return False
        return self._best([self.alpha0] * rows, rows, self.max_gamma) > 0

    def _best(self, alphas: Sequence[float], rows: int, top: int) -> int:
        """The gamma of the highest expected rate, 0 unless some gamma beats plain's by BATCH_MARGIN."""
        rates = [self.expected_rate(alphas, rows, g) for g in range(top + 1)]
        best = max(range(top + 1), key=lambda g: rates[g])
        return best if rates[best] >= (1 + BATCH_MARGIN) * rates[0] else 0

    def report(self) -> dict:
        line = self.target_time.line(0)
        return {"name": "adaptive", "batch": True, "gamma": self.gamma,
                "pass_seconds": None if line is None else {"a": line[0], "b_per_token": line[1]},
                "decided": dict(sorted(self.decided.items()))}


class RowAlpha:
    """A batch row's part of :class:`BatchGamma`: its alpha (and what its stats report as the schedule)."""

    name = "adaptive"

    def __init__(self, policy: BatchGamma):
        self.policy = policy
        self._alpha = AlphaEstimate(policy.pooled.value, policy.decay)

    @property
    def alpha(self) -> float:
        return self._alpha.value

    def update(self, feedback: StepFeedback) -> None:
        self._alpha.observe(feedback.betas)

    def age(self, toward: float) -> None:
        """A round in which its draft proposed nothing (:func:`settle_alphas`)."""
        self._alpha.age(toward)

    def report(self) -> dict:
        return {**self.policy.report(), "alpha": self.alpha}


def settle_alphas(policy: BatchGamma, rows: Sequence[Any], drafted: Sequence[bool], betas: Sequence[list]) -> None:
    """After a batched round: each model-drafted row's betas (``drafted``: its draft model proposed this round) go
    to the batch's pooled alpha; a model-drafted row that proposed nothing (plain, copying, its prediction) has its
    alpha estimates aged toward the pooled one (:meth:`AlphaEstimate.age`). Its own estimate can only move while
    it drafts, and the batch stops drafting on rows whose estimate a few rejections left low: measured at 2 rows
    on chat (the CPU default pair), one row's 0.38 kept a batch plain for the rest of the request where drafting
    rounds gave 1.2x plain's."""
    for row, proposed, row_betas in zip(rows, drafted, betas):
        if row.draft != MODEL:
            continue
        if proposed:
            policy.pooled.observe(row_betas)
            continue
        row.alpha.age(policy.pooled.value)
        if isinstance(row.schedule, RowAlpha):
            row.schedule.age(policy.pooled.value)


def round_gammas(engine: Any) -> list[int]:
    """Each row of ``engine``'s k this round: its schedule's, capped by the batch's gamma for the model-drafted rows
    (``speculation="measured"``); an adaptive row drafts the batch's gamma."""
    rows = engine.rows
    own = [None if row.draft is None or isinstance(row.schedule, RowAlpha) else row.schedule.next_gamma()
           for row in rows]
    measured = engine.speculation == "measured" and engine.draft_session is not None and len(rows) >= 2
    idle = idle_rows(engine)
    chosen = [i for i, row in enumerate(rows) if row.draft is not None and not idle[i] and (
        isinstance(row.schedule, RowAlpha) or (measured and row.draft == MODEL and own[i] > 0))]
    # requests waiting to join: the batch is about to hold more rows; where it would not draft at that size (or has
    # not decided there yet) it stays plain now rather than catch drafts up for a few rounds
    soon = engine.soon()
    waits_plain = measured and soon > len(rows) and not engine.gamma_policy.drafts_at(soon)
    shared = 0
    if chosen and not waits_plain:  # Theorem 8 over the batch's pass over B (gamma + 1) tokens, up to the widest gamma
        top = max(rows[i].config.gamma_bound if own[i] is None else own[i] for i in chosen)
        alphas = [rows[i].schedule.alpha if own[i] is None else rows[i].alpha.value for i in chosen]
        shared = engine.gamma_policy.choose(alphas, len(rows), top)
    ks = []
    for i, row in enumerate(rows):
        if row.draft is None or idle[i]:
            ks.append(0)
            continue
        k = shared if own[i] is None else (min(own[i], shared) if i in chosen else own[i])
        generated = len(row.sequence) - row.start_len
        ks.append(max(0, min(k, row.limit - generated - 1)))  # n accepted + 1 target token must fit
    return ks


def idle_rows(engine: Any) -> list[bool]:
    """For each row of ``engine``: whether it is a model-drafted row that cannot draft this round, its draft far
    behind its sequence (more than CATCH_UP tokens) and feeding it what it lacks not paying
    (:meth:`BatchGamma.feed_pays`; before that can be told, it can draft). Such a row runs plain and is left out of the
    batch's gamma (a round whose gamma counted it would expect its drafts). Weighed at the rows the batch holds once
    the requests waiting have joined (``engine.soon()``), as :func:`specdec.batch.alone.waits_in_batch` weighs a lone
    row kept in the batch for them: at one row it would otherwise catch its draft up for the few rounds before they
    join (0.94 s of the 0.5B for 5 tokens, in one process, 2 chat clients). Only with ``speculation="measured"``."""
    rows = engine.rows
    if engine.draft_session is None or engine.speculation != "measured":
        return [False] * len(rows)
    policy, saving, idle = engine.gamma_policy, None, []
    at = max(len(rows), engine.soon())  # (requests waiting join in a few rounds: the row runs among them)
    for i, row in enumerate(rows):
        gap = len(row.sequence) - engine.draft_session.lengths[i]
        if row.draft != MODEL or gap <= CATCH_UP:
            idle.append(False)
            continue
        if saving is None:  # (once a round: the same for every row)
            saving = policy.feed_saving(at)
        generated = len(row.sequence) - row.start_len
        idle.append(policy.feed_pays(at, gap, row.limit - generated, generated, saving) is False)
    return idle


def draft_prefills(engine: Any, rows: int) -> bool:
    """Whether a model-drafted row joining a batch of ``rows`` rows (itself included) has its draft prefilled
    with its prompt as it goes in. Where the batch drafts nothing at that size, or has not decided yet
    (``speculation="measured"``), its draft catches up once it drafts, a chunk a round
    (:func:`~specdec.batch.drafting.propose_model`): the same passes, and none where the batch stays plain."""
    if engine.gate is not None:
        return engine.gate.settled(rows) is not False
    if engine.speculation == "measured" and rows >= 2:
        return engine.gamma_policy.drafts_at(max(rows, engine.soon()))
    return True
