"""Random numbers keyed by (seed, position, draw, element): the same on every run, eager or replayed.

A captured CUDA graph replays the same kernels on the same buffers, so a random source inside it must
not depend on state the host advances between calls. :class:`PositionalRandom` is counter-based, as
Philox is in vLLM's graphed draft loop: each uniform number is a hash of the generation's seed, the
round's position (its sequence length, a device tensor the graph reads), the index of the draw within
the round (fixed by the order of the code) and the element's index. So a round run eagerly and the
same round replayed from a graph draw the same numbers, on CPU and CUDA alike, and two rounds at
different positions draw independent ones.

The hash is MurmurHash3's 32-bit finaliser (a bijection with full avalanche), applied field by field and
computed in int64 tensors whose products stay below 2**63; two 32-bit hashes give 53 random bits. Every
value is a uniform in [0, 1) with as many bits as the dtype's mantissa holds (never 1.0).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9  # separates the seed field from the others
_MANTISSA_BITS = {torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}


def _mul32(h: torch.Tensor, c: int) -> torch.Tensor:
    """(h * c) mod 2**32 for h in [0, 2**32) (int64) and a constant c < 2**32, without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (h * lo + (((h * hi) & 0xFFFF) << 16)) & MASK32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser on 32-bit values held in int64: a bijection of [0, 2**32)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


class PositionalRandom:
    """A random source for one round, keyed by ``seed`` and ``position`` ([1] or [] long device tensors).

    ``uniform(shape, dtype)`` is its one call (what :func:`specdec.sampling.uniform` asks of a generator);
    each call of a round is a new draw index, so a round's draws depend only on the order of its code.
    """

    def __init__(self, seed: torch.Tensor, position: torch.Tensor):
        self.seed = seed
        self.position = position
        self.draws = 0

    def uniform(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        bits = _MANTISSA_BITS.get(dtype)
        if bits is None:
            raise TypeError(f"uniform numbers come as a float dtype, got {dtype}")
        key = fmix32((self.seed.reshape(()) & MASK32) ^ GOLDEN32)
        key = fmix32(key ^ (self.position.reshape(()) & MASK32))
        key = fmix32(key ^ self.draws)  # [] int64
        self.draws += 1
        element = torch.arange(math.prod(shape), dtype=torch.long, device=self.seed.device)  # [N]
        high = fmix32(key ^ fmix32(2 * element))  # [N], 32 random bits
        low = fmix32(key ^ fmix32(2 * element + 1)) >> 11  # [N], 21 more
        whole = (high * 2**21 + low).double() / 2.0**53  # [N] in [0, 1), 53 bits
        if bits < 53:  # keep the dtype's bits (floor): the cast is exact and never rounds up to 1.0
            whole = torch.floor(whole * 2.0**bits) / 2.0**bits
        return whole.to(dtype).reshape(shape)
