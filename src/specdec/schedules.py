"""Gamma schedules: how many tokens to draft at each step (paper Section 3.5; report, "Varying Gamma").

A schedule only changes how much is drafted, never what is accepted, so every schedule keeps the
output distribution exact.

- ``constant``: gamma every step (the paper's setting).
- ``heuristic``: +2 after a fully accepted step, -1 otherwise, within [1, max_gamma] (the rule of
  transformers' assisted generation).
- ``adaptive``: keeps exponentially weighted estimates of alpha (the ratio of the decayed sums of the
  observed beta = sum_x min(p, q) and of the positions verified), of the cost ratio c and of the marginal
  verification cost s (from the measured draft and target times), drafts optimal_gamma(alpha, c, s) tokens, the maximiser of
  Theorem 8, and drafts nothing (plain steps, with a probe now and then) where no gamma pays.
- ``confidence``: drafts up to max_gamma tokens but the draft stops as soon as its own top
  probability falls below a threshold (decided inside the drafter, see ``Drafter.stop_below``).

A batch's gamma is :class:`specdec.batch.speculation.BatchGamma` (one gamma for a batch's model-drafted rows, from
the batch's measured costs), made of the same parts as :class:`AdaptiveSchedule`: :class:`AlphaEstimate` per
sequence, :class:`DecayedTimes` for the measured costs, and the same constants.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.analysis import optimal_gamma, speculation_pays

SCHEDULES = ("constant", "heuristic", "adaptive", "confidence")
HEURISTIC_GROW = 2  # heuristic: gamma + 2 after a step whose drafted tokens were all accepted ...
HEURISTIC_SHRINK = 1  # ... and gamma - 1 after a rejection (the report's rule)
ADAPTIVE_DECAY = 0.9  # adaptive: weight of the past, per step, in the exponential averages of alpha and times
ADAPTIVE_ALPHA0 = 0.8  # adaptive: alpha assumed before any step was observed ...
ADAPTIVE_PRIOR_POSITIONS = 1.0  # ... with the weight of this many verified positions
ADAPTIVE_PROBE_EVERY = 16  # adaptive: plain steps between two probing steps that draft one token
ADAPTIVE_LEARNING_STEPS = 4  # adaptive: steps at most spent timing a second draft size before deciding


@dataclass
class StepFeedback:
    """What one verification step tells a schedule."""

    drafted: int
    accepted: int
    betas: list[float]  # beta at each verified position
    time_draft: float  # seconds spent drafting this step
    time_target: float  # seconds of the target's verification pass
    target_tokens: int = 0  # tokens that pass computed: drafted + 1, more when it also caught up the prompt


class AlphaEstimate:
    """alpha from observed betas: their decayed sum over the decayed count of the positions they verified,
    starting from ``alpha0`` with the weight of ``ADAPTIVE_PRIOR_POSITIONS`` positions.

    A step's betas are one token's each up to the first rejection, so a per-token average read right after
    a rejection, as every decision is made, would sit well below alpha and draft too little (0.85 for a
    draft accepted 94% of the time, gamma 2 where 5 was best). The adaptive schedule's and each adaptive
    batch row's."""

    def __init__(self, alpha0: float = ADAPTIVE_ALPHA0, decay: float = ADAPTIVE_DECAY):
        self.decay, self.value = decay, alpha0
        self._beta_sum = alpha0 * ADAPTIVE_PRIOR_POSITIONS  # decayed sum of the betas (the prior's weight first)
        self._positions = ADAPTIVE_PRIOR_POSITIONS  # decayed count of the positions they verified

    def observe(self, betas: list[float]) -> None:
        if betas:
            self._beta_sum = self.decay * self._beta_sum + sum(betas)
            self._positions = self.decay * self._positions + len(betas)
            self.value = self._beta_sum / self._positions

    def age(self, toward: float) -> None:
        """A step in which this sequence's draft proposed nothing: its evidence ages a step and ``toward`` (a
        prior: the batch's pooled alpha) gains the weight of one verified position's share, so an estimate
        left low by a few rejections does not keep a batch from drafting for the rest of a request
        (:class:`specdec.batch.speculation.BatchGamma`)."""
        weight = (1 - self.decay) * ADAPTIVE_PRIOR_POSITIONS
        self._beta_sum = self.decay * self._beta_sum + weight * toward
        self._positions = self.decay * self._positions + weight
        self.value = self._beta_sum / self._positions


class DecayedTimes(dict):
    """size -> exponentially averaged seconds (a draft of g tokens, a pass over k tokens), and the
    least-squares line through them: the measured costs both gamma policies decide from."""

    def __init__(self, decay: float = ADAPTIVE_DECAY):
        super().__init__()
        self.decay = decay

    def observe(self, size: int, seconds: float) -> None:
        self[size] = seconds if size not in self else self.decay * self[size] + (1 - self.decay) * seconds

    def line(self, at: int) -> tuple[float, float] | None:
        """(value at ``at``, slope >= 0) of the least-squares line through the points; None before two sizes."""
        if len(self) < 2:
            return None
        xs = list(self)
        ys = [self[x] for x in xs]
        x_mean, y_mean = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(xs, ys)) / sum((x - x_mean) ** 2 for x in xs)
        slope = max(slope, 0.0)
        return y_mean - slope * (x_mean - at), slope

    def monotone(self) -> list[tuple[int, float]]:
        """The measured (size, seconds) in order of size, made non-decreasing by pooling adjacent points that
        disagree (least squares, each point weighted by one): a pass over more tokens costs no less, and two
        neighbouring sizes timed a few rounds apart differ by the machine's noise (at 8 rows on the AMX Xeon 13
        tokens timed 0.145 s, 16 tokens 0.132 s: read raw, three more tokens cost nothing).

        >>> times = DecayedTimes(); times.update({8: 0.09, 12: 0.13, 13: 0.15, 16: 0.13})
        >>> tuple(round(y, 3) for _, y in times.monotone())   # at 8, 12, 13 and 16 tokens
        (0.09, 0.13, 0.14, 0.14)
        """
        blocks: list[list[float]] = []  # [sum, count] of each pooled run of sizes
        for x in sorted(self):
            blocks.append([self[x], 1.0])
            while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
                total, count = blocks.pop()
                blocks[-1][0] += total
                blocks[-1][1] += count
        ys = [total / count for total, count in blocks for _ in range(int(count))]
        return list(zip(sorted(self), ys))

    def at(self, size: int) -> float | None:
        """The time at ``size`` read off the measured points made non-decreasing (:meth:`monotone`), piecewise
        linear: between two measured sizes the line through them, past the largest the slope of the last two, below
        the smallest its time (a pass over fewer tokens costs no more). None before two sizes. Unlike :meth:`line`
        it follows a pass time that is flat while the weights' reading bounds it and then grows with the tokens (a
        CPU's batched pass)."""
        if len(self) < 2:
            return None
        points = self.monotone()
        if size <= points[0][0]:
            return points[0][1]
        for (lo, t_lo), (hi, t_hi) in zip(points, points[1:]):
            if size <= hi:
                return t_lo + (t_hi - t_lo) * (size - lo) / (hi - lo)
        (lo, t_lo), (hi, t_hi) = points[-2], points[-1]
        return t_hi + (t_hi - t_lo) * (size - hi) / (hi - lo)


class PlainProbe:
    """While no gamma pays: plain steps (gamma 0), and one drafted token every ``every`` of them, so that
    alpha and the draft's cost stay up to date."""

    def __init__(self, every: int = ADAPTIVE_PROBE_EVERY):
        self.every, self._run, self.plain_steps = every, 0, 0

    def next(self) -> int:
        """The gamma of a step decided plain: 0, or 1 for a probe."""
        self._run += 1
        gamma = 1 if self._run % self.every == 0 else 0
        self.plain_steps += gamma == 0
        return gamma

    def reset(self) -> None:
        """A step that drafts (some gamma pays): the count to the next probe starts again."""
        self._run = 0


class GammaSchedule:
    """Base: constant gamma."""

    name = "constant"

    def __init__(self, gamma: int, max_gamma: int):
        self.gamma = gamma
        self.max_gamma = max_gamma

    def next_gamma(self) -> int:
        return self.gamma

    def update(self, feedback: StepFeedback) -> None:
        return None

    def report(self) -> dict:
        """What the schedule ended with, for GenerationStats.schedule."""
        return {"name": self.name, "gamma": self.gamma}


class HeuristicSchedule(GammaSchedule):
    name = "heuristic"

    def update(self, feedback: StepFeedback) -> None:
        if feedback.drafted == 0:
            return
        if feedback.accepted == feedback.drafted:
            self.gamma = min(self.max_gamma, self.gamma + HEURISTIC_GROW)
        else:
            self.gamma = max(1, self.gamma - HEURISTIC_SHRINK)


class AdaptiveSchedule(GammaSchedule):
    """Theorem 8 on running estimates of alpha, c and the marginal verification cost s.

    From every step it learns alpha (:class:`AlphaEstimate`), the draft's time
    per round for each number of drafted tokens, and the target's time per pass for each pass size k
    (drafted + 1 tokens). A least-squares line through the mean pass times, T(k) = T1 (1 + s (k - 1)),
    gives the single-step time T1 and s; one through the draft's, D(g) = T1 (f + c g), gives c and the
    draft's fixed cost per round f (a model draft's catch-up pass; taken as 0 until two sizes are timed).
    Without f a round's fixed cost would count as cost per token, larger the fewer tokens are drafted, and
    pull gamma down step after step (on the AMX Xeon the int8 0.5B's adaptive run drafted 2 tokens where a
    constant 4 was 12% faster). It then drafts ``optimal_gamma(alpha, c, max_gamma, s, f)`` tokens, or none
    (a plain step) when no gamma beats plain decoding (see :func:`specdec.analysis.speculation_pays`). Plain steps also time T1,
    and every ``probe_every`` of them drafts one token to keep alpha and c up to date.

    Until two pass sizes have been timed it drafts ``gamma`` and then 1 token, so that s can be fitted, and
    until two draft sizes have (a few steps at most) it goes on alternating, so that f can be.
    Passes larger than max_gamma + 1 tokens (the prefill) are not timed. The draft is timed only on steps
    that follow a drafting step: on the first step a model draft also reads the whole prompt, and after
    plain steps it first catches up with every token it missed, which would inflate c. ``decay`` is the
    weight of the past in the exponential averages.
    """

    name = "adaptive"

    def __init__(self, gamma: int, max_gamma: int, decay: float = ADAPTIVE_DECAY, alpha0: float = ADAPTIVE_ALPHA0,
                 probe_every: int = ADAPTIVE_PROBE_EVERY):
        super().__init__(gamma, max_gamma)
        self._alpha = AlphaEstimate(alpha0, decay)
        self._probe = PlainProbe(probe_every)
        self.c: float | None = None
        self.s: float | None = None
        self.f: float | None = None
        self._first_gamma = gamma
        self._learning_steps = 0  # steps spent timing a second draft size (at most LEARNING_STEPS)
        self._draft_time = DecayedTimes(decay)  # drafted tokens g -> averaged seconds of drafting
        self._pass_time = DecayedTimes(decay)  # pass size k -> averaged seconds
        self._drafted_before: bool | None = None  # did the previous step draft? (None: no step yet)
        self.pays: bool | None = None  # the last decision: does some gamma beat plain decoding?

    @property
    def alpha(self) -> float:
        return self._alpha.value

    @property
    def plain_steps(self) -> int:
        """Steps decided plain (probes not counted)."""
        return self._probe.plain_steps

    def _fit(self) -> tuple[float, float] | None:
        """(T1, s) from the averaged pass times, or None before two pass sizes are known."""
        line = self._pass_time.line(1)
        if line is None or line[0] <= 0:
            return None
        t1, slope = line
        return t1, slope / t1

    def _draft_costs(self, t1: float) -> tuple[float, float] | None:
        """(c, f) in target steps from the averaged drafting times: per drafted token and per round."""
        if not self._draft_time:
            return None
        if len(self._draft_time) < 2:  # one size timed: all of it per token
            ((g, t),) = self._draft_time.items()
            return t / g / t1, 0.0
        fixed, per_token = self._draft_time.line(0)
        if fixed < 0:  # the line through the origin would fit better: no fixed cost
            g_mean = sum(self._draft_time) / len(self._draft_time)
            return sum(self._draft_time.values()) / len(self._draft_time) / g_mean / t1, 0.0
        return per_token / t1, fixed / t1

    def update(self, feedback: StepFeedback) -> None:
        self._alpha.observe(feedback.betas)
        g = feedback.drafted
        if 0 < g <= self.max_gamma and feedback.time_draft > 0 and self._drafted_before:
            self._draft_time.observe(g, feedback.time_draft)
        self._drafted_before = feedback.drafted > 0
        k = feedback.target_tokens
        if 0 < k <= self.max_gamma + 1 and feedback.time_target > 0:
            self._pass_time.observe(k, feedback.time_target)
        fit = self._fit()
        if fit is None:  # learn a second pass size first
            if self._pass_time:
                self.gamma = 1 if 2 not in self._pass_time else max(2, self.gamma)
            return
        t1, self.s = fit
        if len(self._draft_time) < 2 and self._learning_steps < ADAPTIVE_LEARNING_STEPS:
            # one draft size cannot tell a fixed cost per round from a cost per token: time another one first
            self._learning_steps += 1
            self.gamma = self._first_gamma if 1 in self._draft_time or not self._draft_time else 1
            return
        costs = self._draft_costs(t1)
        if costs is not None:
            self.c, self.f = costs
        if self.c is None:
            return
        alpha = min(max(self.alpha, 0.0), 1.0 - 1e-6)
        self.pays = speculation_pays(alpha, self.c, self.s, self.f, self.max_gamma)
        if self.pays:
            self._probe.reset()
            self.gamma = optimal_gamma(alpha, self.c, self.max_gamma, self.s, self.f)
        else:
            self.gamma = self._probe.next()

    def report(self) -> dict:
        return {**super().report(), "alpha": self.alpha, "c": self.c, "s": self.s, "f": self.f,
                "plain_steps": self.plain_steps,
                "pays": self.pays}


class ConfidenceSchedule(GammaSchedule):
    """Up to max_gamma tokens; the drafter itself stops early when unsure (see module docstring)."""

    name = "confidence"

    def next_gamma(self) -> int:
        return self.max_gamma


def make_schedule(name: str, gamma: int, max_gamma: int) -> GammaSchedule:
    cls = {"constant": GammaSchedule, "heuristic": HeuristicSchedule, "adaptive": AdaptiveSchedule,
           "confidence": ConfidenceSchedule}[name]
    return cls(gamma, max_gamma)
