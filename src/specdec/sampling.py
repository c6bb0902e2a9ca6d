"""Standardized sampling (paper Section 2.2).

Every sampling method is cast to plain sampling from an adjusted distribution before speculative
sampling sees it: temperature scales the logits, top-k keeps the k most likely tokens, top-p keeps
the smallest set whose mass reaches p, and temperature 0 (argmax) is a one-hot distribution. The
same transform is applied to the target's logits (giving p) and to the draft's (giving q).

Greedy decoding also has its own exact path: :func:`argmax` compares token ids, never
probabilities, so a near-tie cannot be broken differently by a softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from specdec.errors import SpecDecError


@dataclass(frozen=True)
class SamplingParams:
    """How one distribution is standardized.

    temperature: 0 means argmax (greedy); otherwise logits are divided by it.
    top_k: keep the k most likely tokens (None or 0: all).
    top_p: keep the smallest prefix of the sorted distribution whose mass reaches top_p (1.0: all).
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if (isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float))
                or not math.isfinite(self.temperature)):
            raise SpecDecError(
                f"temperature must be a finite number >= 0 (0 means greedy), got {self.temperature!r}; use 0 for "
                "greedy or a positive value such as 1.0 for sampling"
            )
        if self.temperature < 0:
            raise SpecDecError(
                f"temperature must be >= 0 (0 means greedy), got {self.temperature}; use 0 for greedy "
                "or a positive value such as 1.0 for sampling"
            )
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise SpecDecError(f"top_k must be an integer >= 1 (or None for no limit), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise SpecDecError(f"top_p must be in (0, 1] (1.0 disables it), got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Greedy choice. logits: [..., V] -> token ids [...]."""
    return logits.argmax(dim=-1)


def standardize(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Turn logits into the adjusted distribution that is actually sampled from.

    logits: [..., V] (any float dtype) -> probabilities [..., V] in float32, each row summing to 1.
    Temperature 0 gives the one-hot distribution of the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(argmax(logits), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k is not None and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        cumulative = sorted_probs.cumsum(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; the top token always stays.
        drop_sorted = (cumulative - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one token per row by inverting the cumulative distribution. probs: [..., V] -> token ids [...].

    Row sums need not be 1 (the rows are scaled). Token i is drawn when cdf[i-1] <= u < cdf[i] for
    u ~ U[0, sum), so it has probability exactly p_i (up to float64 rounding) and a zero-probability
    token is never drawn. Measured on this 2-core CPU for a 151,936-token vocabulary: 0.2 ms per row,
    against 5.4 ms for ``torch.multinomial`` (which was 80% of a sampled step's non-model time).
    """
    flat = probs.reshape(-1, probs.shape[-1])  # [rows, V]
    cdf = flat.double().cumsum(-1)  # [rows, V]; .double() first: cumsum(dtype=float64) is 7x slower here
    u = uniform((flat.shape[0], 1), generator, torch.float64, probs.device) * cdf[:, -1:]  # [rows, 1]
    index = torch.searchsorted(cdf, u, right=True).clamp_(max=flat.shape[-1] - 1)  # [rows, 1]
    return index.reshape(probs.shape[:-1])


def uniform(shape: tuple[int, ...] | int, generator: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """U[0, 1) numbers of ``shape``: from a torch.Generator (or the default one for None), or from a source with
    a ``uniform(shape, dtype)`` method (:class:`specdec.counter_random.PositionalRandom`, what a captured
    round draws from)."""
    if hasattr(generator, "uniform"):
        return generator.uniform(shape, dtype)
    return torch.rand(shape, generator=generator, dtype=dtype, device=device)
