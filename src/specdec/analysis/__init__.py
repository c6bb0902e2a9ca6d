"""The paper's closed forms (Leviathan, Kalman & Matias 2023, Section 3).

alpha: acceptance rate, E[beta] with beta = sum_x min(p(x), q(x)) (Theorem 5, Corollary 6).
gamma: drafted tokens per target call.
c: cost coefficient, time of one draft step / time of one target step (Definition 7).
c_hat: arithmetic operations per token of the draft / of the target (Theorem 10).
s: marginal verification cost, what each extra token in one target pass costs, in single target steps.
   The paper assumes the target verifies gamma + 1 tokens for the price of one (s = 0), which holds
   where a step is memory-bound (a GPU; bf16 on a CPU with AMX). Where small matrix products are
   compute-bound (an AVX2-only CPU: measured s = 0.7-0.83 in bf16, 0.28-0.37 in fp32), a pass over
   gamma + 1 tokens costs 1 + s gamma steps. Every formula below takes s and reduces to the paper's at s = 0.

All functions accept alpha = 1 and alpha = 0 without dividing by zero.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")


def _check_gamma(gamma: int) -> None:
    if gamma < 0 or int(gamma) != gamma:
        raise ValueError(f"gamma must be a non-negative integer, got {gamma}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Equation 1: expected tokens per run of Algorithm 1, (1 - alpha^(gamma+1)) / (1 - alpha).

    The limit at alpha = 1 is gamma + 1 (every draft accepted, plus the bonus token).
    """
    _check_alpha(alpha)
    _check_gamma(gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    # sum_{i=0}^{gamma} alpha^i, the same value without cancellation near alpha = 1
    return float(sum(alpha**i for i in range(gamma + 1)))


def walltime_improvement(alpha: float, gamma: int, c: float, s: float = 0.0, f: float = 0.0) -> float:
    """Theorem 8: expected walltime improvement, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)).

    With a marginal verification cost s the target's pass costs 1 + s gamma steps instead of 1, so the
    denominator becomes gamma (c + s) + 1: s acts as extra draft cost per drafted token. A draft that also
    costs f target steps per round whatever gamma is (a model draft's catch-up pass over the last two tokens)
    adds f: gamma (c + s) + 1 + f.
    """
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c}")
    if s < 0:
        raise ValueError(f"s must be >= 0, got {s}")
    if f < 0:
        raise ValueError(f"f must be >= 0, got {f}")
    return expected_tokens(alpha, gamma) / (gamma * (c + s) + 1.0 + f)


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Theorem 10: expected factor of increase in arithmetic operations,
    (1 - alpha)(gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))."""
    if c_hat < 0:
        raise ValueError(f"c_hat must be >= 0, got {c_hat}")
    return (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 32, s: float = 0.0, f: float = 0.0) -> int:
    """Section 3.5: the integer gamma in [1, max_gamma] maximising Theorem 8 (smallest on ties; s and f as in
    :func:`walltime_improvement`).

    It may still be slower than plain decoding: :func:`speculation_pays` tells whether any gamma wins.
    """
    if max_gamma < 1:
        raise ValueError(f"max_gamma must be >= 1, got {max_gamma}")
    best, best_value = 1, -math.inf
    for gamma in range(1, max_gamma + 1):
        value = walltime_improvement(alpha, gamma, c, s, f)
        if value > best_value + 1e-12:
            best, best_value = gamma, value
    return best


def min_improvement(alpha: float, c: float, s: float = 0.0) -> float:
    """Corollary 9: when alpha > c (+ s), some gamma improves walltime by at least (1 + alpha) / (1 + c + s)
    (Theorem 8 at gamma = 1)."""
    _check_alpha(alpha)
    return (1.0 + alpha) / (1.0 + c + s)


def speculation_pays(alpha: float, c: float, s: float = 0.0, f: float = 0.0, max_gamma: int = 32) -> bool:
    """Whether some gamma >= 1 beats plain decoding: alpha > c + s.

    Theorem 8 (with s) is E[tokens](gamma) / (1 + gamma (c + s)); each extra drafted token adds at most
    alpha^gamma <= alpha expected tokens and costs c + s, so if gamma = 1 does not win, no gamma does. With a
    fixed cost per round f > 0 a longer draft spreads it, so every gamma up to ``max_gamma`` is tried.
    """
    _check_alpha(alpha)
    if f == 0:
        return alpha > c + s
    return any(walltime_improvement(alpha, g, c, s, f) > 1.0 for g in range(1, max_gamma + 1))


def oracle_expected_tokens(alpha: float) -> float:
    """Section 3.5: with an oracle choosing gamma per step, expected tokens per target call is
    1 / (1 - alpha) (infinite at alpha = 1)."""
    _check_alpha(alpha)
    return math.inf if alpha == 1.0 else 1.0 / (1.0 - alpha)


def alpha_from_distributions(p: torch.Tensor, q: torch.Tensor, lenience: float = 1.0) -> torch.Tensor:
    """beta = sum_x min(p(x), q(x)) per row (Theorem 5); with lenience l in (0, 1]:
    sum_x min(p(x) / l, q(x)) (Appendix A.5).

    p, q: [..., V] probabilities. Returns [...]. The mean over positions is the empirical alpha.
    """
    if not 0.0 < lenience <= 1.0:
        raise ValueError(f"lenience must be in (0, 1], got {lenience}")
    return torch.minimum(p / lenience, q).sum(-1)


def lk_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """D_LK(p, q) = sum_x |p(x) - M(x)| with M = (p + q) / 2, which equals 1 - sum_x min(p, q)
    (Definition 2, Lemma 3). p, q: [..., V] -> [...]."""
    return (p - (p + q) / 2).abs().sum(-1)


class LogitDistance(NamedTuple):
    """How far q's next-token distributions are from p's, per position (each [...])."""

    kl: torch.Tensor  # KL(p || q) in nats
    beta: torch.Tensor  # sum_x min(p(x), q(x)) at temperature 1 (Theorem 5)
    agree: torch.Tensor  # bool: the argmaxes agree (beta at temperature 0)


def logit_distance(lp: torch.Tensor, lq: torch.Tensor) -> LogitDistance:
    """KL(p || q), beta and argmax agreement of two models' logits at the same positions, teacher-forced (what
    scripts/quantization_distance.py and scripts/smoothing_check.py report for a quantized copy q of p).

    lp, lq: [..., V_p], [..., V_q] logits; both are cut to the shorter vocabulary (a padded embedding's extra rows)
    and computed in float32.
    """
    if lp.shape[:-1] != lq.shape[:-1]:
        raise ValueError(f"logits of p and q must cover the same positions, got shapes {tuple(lp.shape)} and "
                         f"{tuple(lq.shape)}")
    width = min(lp.shape[-1], lq.shape[-1])
    log_p, log_q = lp[..., :width].float().log_softmax(-1), lq[..., :width].float().log_softmax(-1)  # [..., V]
    p = log_p.exp()
    return LogitDistance(kl=(p * (log_p - log_q)).sum(-1), beta=alpha_from_distributions(p, log_q.exp()),
                         agree=log_p.argmax(-1) == log_q.argmax(-1))
