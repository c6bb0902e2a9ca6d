"""Gamma schedules: how many tokens to draft at each step (paper Section 3.5; report, "Varying Gamma").

A schedule only changes how much is drafted, never what is accepted, so every schedule keeps the
output distribution exact.

- ``constant``: gamma every step (the paper's setting).
- ``heuristic``: +2 after a fully accepted step, -1 otherwise, within [1, max_gamma] (the rule of
  transformers' assisted generation).
- ``adaptive``: keeps an exponentially weighted estimate of alpha (from the observed
  beta = sum_x min(p, q)) and of the cost ratio c (measured draft time per drafted token over target
  time per call), and drafts optimal_gamma(alpha, c) tokens, the maximiser of Theorem 8.
- ``confidence``: drafts up to max_gamma tokens but the draft stops as soon as its own top
  probability falls below a threshold (decided inside the drafter, see ``Drafter.stop_below``).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.analysis import optimal_gamma

SCHEDULES = ("constant", "heuristic", "adaptive", "confidence")


@dataclass
class StepFeedback:
    """What one verification step tells a schedule."""

    drafted: int
    accepted: int
    betas: list[float]  # beta at each verified position
    time_draft: float  # seconds spent drafting this step
    time_target: float  # seconds of the target's verification pass


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


class HeuristicSchedule(GammaSchedule):
    name = "heuristic"

    def update(self, feedback: StepFeedback) -> None:
        if feedback.drafted == 0:
            return
        if feedback.accepted == feedback.drafted:
            self.gamma = min(self.max_gamma, self.gamma + 2)
        else:
            self.gamma = max(1, self.gamma - 1)


class AdaptiveSchedule(GammaSchedule):
    """Theorem 8 with running estimates of alpha and c.

    alpha starts at ``alpha0``; c is unknown until a step has been timed, and until then gamma stays
    at its initial value. ``decay`` is the weight of the past in the exponential averages.
    """

    name = "adaptive"

    def __init__(self, gamma: int, max_gamma: int, decay: float = 0.9, alpha0: float = 0.8, c0: float | None = None):
        super().__init__(gamma, max_gamma)
        self.decay = decay
        self.alpha = alpha0
        self.c = c0
        self._draft_time_per_token: float | None = None
        self._target_time: float | None = None

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else self.decay * old + (1 - self.decay) * new

    def update(self, feedback: StepFeedback) -> None:
        for beta in feedback.betas:
            self.alpha = self._ewma(self.alpha, beta)
        if feedback.drafted > 0 and feedback.time_draft > 0:
            self._draft_time_per_token = self._ewma(self._draft_time_per_token, feedback.time_draft / feedback.drafted)
        if feedback.time_target > 0:
            self._target_time = self._ewma(self._target_time, feedback.time_target)
        if self._draft_time_per_token is not None and self._target_time:
            self.c = self._draft_time_per_token / self._target_time
        if self.c is not None:
            alpha = min(max(self.alpha, 0.0), 1.0 - 1e-6)
            self.gamma = optimal_gamma(alpha, self.c, self.max_gamma)


class ConfidenceSchedule(GammaSchedule):
    """Up to max_gamma tokens; the drafter itself stops early when unsure (see module docstring)."""

    name = "confidence"

    def next_gamma(self) -> int:
        return self.max_gamma


def make_schedule(name: str, gamma: int, max_gamma: int) -> GammaSchedule:
    cls = {"constant": GammaSchedule, "heuristic": HeuristicSchedule, "adaptive": AdaptiveSchedule,
           "confidence": ConfidenceSchedule}[name]
    return cls(gamma, max_gamma)
