"""The gamma of a batch (:mod:`specdec.batching`): one gamma for the rows that use the adaptive schedule,
chosen from the batch's measured costs, and each such row's alpha."""

from __future__ import annotations

from typing import Sequence

from specdec.analysis import expected_tokens
from specdec.schedules import StepFeedback


class BatchGamma:
    """One gamma for the rows of a batch that use the adaptive schedule, from the batch's measured costs.

    It keeps each row's alpha (an exponential average of its betas, as :class:`~specdec.schedules.AdaptiveSchedule`),
    and, for the whole batch, the time of a draft step and of a target pass as lines in the number of tokens
    the pass feeds (rows x width): T(n) = a + b n, fitted by least squares on exponentially weighted means
    per n. Each round it drafts the gamma that maximizes the batch's expected tokens per second,

        sum_i E_i(gamma) / (gamma D(B) + T(B (gamma + 1))),  E_i(gamma) = (1 - alpha_i^(gamma+1)) / (1 - alpha_i),

    gamma = 0 (plain steps, B tokens per pass) included: with enough rows (a pass over B x (gamma + 1) tokens
    costing more than the accepted drafts gain) it drafts less, or nothing (with a probe of one drafted
    token every ``probe_every`` plain rounds to keep alpha and the costs up to date). Until two pass sizes
    have been timed it drafts ``gamma``, then 1."""

    def __init__(self, gamma: int, max_gamma: int, decay: float = 0.9, alpha0: float = 0.8, probe_every: int = 16):
        self.gamma, self.max_gamma, self.decay, self.alpha0, self.probe_every = gamma, max_gamma, decay, alpha0, probe_every
        self.target_time: dict[int, float] = {}  # tokens fed -> averaged seconds
        self.draft_time: dict[int, float] = {}  # rows -> averaged seconds of one draft step
        self._plain = 0

    def _ewma(self, table: dict[int, float], key: int, value: float) -> None:
        table[key] = value if key not in table else self.decay * table[key] + (1 - self.decay) * value

    def observe(self, rows: int, width: int, time_target: float, drafted: int, time_draft: float) -> None:
        """A round of ``rows`` rows whose target pass fed ``width`` tokens per row; ``drafted``: the most
        tokens a row drafted (draft steps), in ``time_draft`` seconds."""
        if time_target > 0:
            self._ewma(self.target_time, rows * width, time_target)
        if drafted > 0 and time_draft > 0:
            self._ewma(self.draft_time, rows, time_draft / drafted)

    @staticmethod
    def _line(table: dict[int, float]) -> tuple[float, float] | None:
        if len(table) < 2:
            return None
        xs, ts = list(table), list(table.values())
        x_mean, t_mean = sum(xs) / len(xs), sum(ts) / len(ts)
        b = max(0.0, sum((x - x_mean) * (t - t_mean) for x, t in zip(xs, ts)) / sum((x - x_mean) ** 2 for x in xs))
        return t_mean - b * x_mean, b

    def choose(self, alphas: Sequence[float], rows: int | None = None) -> int:
        """The batch's gamma for the adaptive rows with these alphas, in a batch of ``rows`` rows (default: those;
        the others' tokens per pass do not depend on this gamma)."""
        line = self._line(self.target_time)
        rows = len(alphas) if rows is None else rows
        if line is None or not self.draft_time:
            return 1 if self.target_time else self.gamma
        a, b = line
        step = self.draft_time.get(rows) or self.draft_time[min(self.draft_time, key=lambda r: abs(r - rows))]

        def rate(g: int) -> float:
            tokens = sum(expected_tokens(min(max(al, 0.0), 1 - 1e-6), g) for al in alphas) + rows - len(alphas)
            return tokens / (g * step + a + b * rows * (g + 1))

        best = max(range(self.max_gamma + 1), key=rate)
        if best == 0:
            self._plain += 1
            return 1 if self._plain % self.probe_every == 0 else 0
        self._plain = 0
        return best

    def report(self) -> dict:
        line = self._line(self.target_time)
        return {"name": "adaptive", "batch": True, "gamma": self.gamma,
                "pass_seconds": None if line is None else {"a": line[0], "b_per_token": line[1]}}


class RowAlpha:
    """A row's alpha for :class:`BatchGamma` (and what its stats report as the schedule)."""

    name = "adaptive"

    def __init__(self, policy: BatchGamma, alpha0: float, decay: float = 0.9):
        self.policy, self.alpha, self.decay = policy, alpha0, decay

    def update(self, feedback: StepFeedback) -> None:
        for beta in feedback.betas:
            self.alpha = self.decay * self.alpha + (1 - self.decay) * beta

    def report(self) -> dict:
        return {**self.policy.report(), "alpha": self.alpha}
