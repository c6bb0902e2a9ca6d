"""int8 weights packed for specdec's own int8 kernel (:mod:`specdec.models.kernels.extension`): the layout
[ceil(N / 32), ceil(K / 4), 32, 4] its GEMM streams (32 output columns a group, 4 input columns a 32-bit lane), the
rows' sums it needs for the unsigned activations, and the scales applied per output element."""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.errors import SpecDecError
from specdec.models.kernels.extension import GROUP, LANE, amx_from, loaded
from specdec.models.kernels.int8_matmul import QMAX  # (the oneDNN path's: the same unit)
from specdec.models.quantized.int8_weights import DeferredQWeight, is_per_channel


def pack(*parts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N_i, K] parts (sibling weights, stacked in order) -> the kernel's layout [ceil(N / 32), ceil(K / 4), 32,
    4] (zero padding) and colsum128 [N] int32 (128 * each row's sum), read in one pass by the extension."""
    packed, colsum128 = loaded().pack([p if p.stride(-1) == 1 else p.contiguous() for p in parts])
    return packed, colsum128


def unpack(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """The inverse of :func:`pack`: int8 [N, K]."""
    groups, lanes = packed.shape[0], packed.shape[1]
    return packed.permute(0, 2, 1, 3).reshape(groups * GROUP, lanes * LANE)[:n, :k].contiguous()


class PackedInt8Weight:
    """A qint8 weight [out, in] (symmetric: zero points 0), packed for specdec's int8 kernel with its scales.

    ``PackedInt8Weight(qweight)``, or :meth:`from_parts` with the int8 values, scales and zero points as a stored model
    maps them (:class:`~specdec.models.quantized.int8_weights.DeferredQWeight`): then the packing is the only copy."""

    def __init__(self, qweight: torch.Tensor):
        per_channel = is_per_channel(qweight)
        zero_points = qweight.q_per_channel_zero_points() if per_channel else torch.tensor([qweight.q_zero_point()])
        scales = qweight.q_per_channel_scales() if per_channel else torch.tensor([qweight.q_scale()])
        self._init((qweight.int_repr(),), scales, zero_points, per_channel)

    @classmethod
    def from_parts(cls, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], per_channel: bool) -> "PackedInt8Weight":
        """The weight of sibling parts [(int8 [out_i, in], scales, zero points)] stacked in order (a stored model's
        mapped values: read once, into the packed layout)."""
        weight = cls.__new__(cls)
        ints, scales, zero_points = zip(*parts)
        weight._init(ints, torch.cat(scales), torch.cat(zero_points), per_channel)
        return weight

    def _init(self, ints: tuple[torch.Tensor, ...], scales: torch.Tensor, zero_points: torch.Tensor,
              per_channel: bool) -> None:
        loaded()  # fail here, at load time, not in the first forward pass
        self.out_features, self.in_features = sum(p.shape[0] for p in ints), ints[0].shape[1]
        self.per_channel = per_channel
        if bool(zero_points.ne(0).any()):
            raise SpecDecError("specdec's int8 kernel takes symmetric weights (zero points 0); use "
                               "SPECDEC_INT8_KERNEL=fbgemm for this model")
        self._scales64 = scales.to(torch.float64)  # as stored (the qint8 weight given back)
        # [N]: a quantized row's unit is 1 / QMAX (the oneDNN path's factor, computed the same way)
        self.scales_per_q = scales.to(torch.float32).expand(self.out_features).contiguous() / QMAX
        self.packed, self.colsum128 = pack(*ints)  # [N/32, K/4, 32, 4], [N]

    def qweight(self) -> torch.Tensor:
        """The qint8 weight [out, in] back."""
        ints = unpack(self.packed, self.out_features, self.in_features)
        zero_points = torch.zeros(self.out_features if self.per_channel else 1, dtype=torch.int64)
        return DeferredQWeight([(ints, self._scales64, zero_points)], self.per_channel).make()

    def rows(self, x2: torch.Tensor, per_pass: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x2 [M, K] float32 -> [M, N] float32, bias added. ``per_pass``: one activation scale for the whole pass
        (not block-invariant; for measurements)."""
        return self.row_parts(x2, (), per_pass, bias)[0]

    def row_parts(self, x2: torch.Tensor, widths: Sequence[int], per_pass: bool = False,
                  bias: torch.Tensor | None = None) -> list[torch.Tensor]:
        """:meth:`rows` written as one tensor per part of the columns: ``widths`` [w_i] (summing to N; each part
        but the last starting at a multiple of 32 columns) -> [[M, w_i]], each contiguous (a fused layer's
        siblings, with no slice copied after). Empty ``widths``: one part."""
        return loaded().rows(x2.contiguous(), self.packed, self.colsum128, self.scales_per_q, bias,
                                self.out_features, per_pass, amx_from(), list(widths))
