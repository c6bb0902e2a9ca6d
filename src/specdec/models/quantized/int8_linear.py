"""The int8 linear layer of specdec's int8 models (CPU): dynamic int8, block-invariant.

torch's dynamic int8 (fbgemm kernels: int8 weights, float32 activations quantized on the fly, int32
accumulation) keeps a decoding step memory-bound, so verifying a few tokens costs about what one token
costs. But its activation scale is chosen over the whole forward pass: a position's logits would change
with how many tokens share the pass (1 in plain decoding, gamma + 1 in verification), and an int8 TARGET
would not be token-identical to its own plain decoding.

:class:`Int8Linear` pins that range. Each activation row is divided by its largest absolute value (it
then lies in [-1, 1]); two constant columns holding +1 and -1, whose weights are zero, are appended, so
the tensor's range is always exactly [-1, 1] and fbgemm quantizes every row with the same parameters
whatever else is in the pass. The int32 accumulation is exact (activations are 7-bit with fbgemm's
``reduce_range``: no int16 saturation), and the output row is multiplied back by its row's scale and
the bias added, elementwise. Every output row therefore depends on its own input row only, bit for bit;
it is also a per-token activation scale, closer to the float layer than the per-pass one (relative
error 0.018 against 0.029 on a random 1536x8960 layer). Attention is made block-invariant by
:mod:`specdec.models.native.row_attention`; together they make the int8 model's logits for a k-token block
identical to k one-token steps, which is what exact verification needs.

The appended columns are padded to a multiple of :data:`K_ALIGN` (measured: docs/int8_target.md).
A :class:`Int8Linear` keeps one workspace per thread and width (``[rows, K + pad]``, the pinned columns
written once), so a forward pass allocates nothing but its output.
"""

from __future__ import annotations

import itertools
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import torch

from specdec.errors import SpecDecError
from specdec.models.kernels import int8_matmul
from specdec.models.kernels import extension
from specdec.models.quantized import int8_packed
from specdec.models.kernels import threads
from specdec.models.quantized.int8_weights import DeferredQWeight, contiguous_q, quantize_weight, with_ints

#: The pinned columns are padded so that K + pad is a multiple of this (fbgemm's K blocking; measured).
K_ALIGN = 8
_TINY = int8_matmul._TINY  # the smallest row scale (an all-zero row then stays zero instead of becoming NaN)
#: Workspaces are kept for passes of up to this many rows (decoding steps); a longer pass (a prefill)
#: takes a buffer of its own, so a long prompt leaves no large buffer behind.
_KEPT_ROWS = 64


def padded_width(in_features: int) -> int:
    """The width of an :class:`Int8Linear`'s packed weight: ``in_features`` plus the two pinned columns,
    rounded up to :data:`K_ALIGN`."""
    return -(-(in_features + 2) // K_ALIGN) * K_ALIGN


class _Workspaces(threading.local):
    """Per thread: ``{(in_features, width, inference mode): [rows, width] float32}`` whose columns in_features.. hold +1, -1,
    0... (sibling layers that read one input are fused, so each input is normalized once)."""

    def __init__(self):
        self.buffers: dict[tuple[int, int], torch.Tensor] = {}

    def normalized(self, x2: torch.Tensor, in_features: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x2 [M, K] -> (its rows divided by their largest absolute values, with the pinned columns
        [M, width]; the row scales [M, 1])."""
        # a buffer made under inference mode cannot be written outside it (a pass under no_grad after a
        # generation, two models sharing a width): one buffer per mode
        key = (in_features, width, torch.is_inference_mode_enabled())
        rows = x2.shape[0]
        buf = self.buffers.get(key)
        if buf is None or buf.shape[0] < rows:
            buf = torch.zeros(rows if rows > _KEPT_ROWS else _KEPT_ROWS, width)
            buf[:, in_features] = 1.0  # the pinned range: every pass spans exactly [-1, 1]
            buf[:, in_features + 1] = -1.0
            if rows <= _KEPT_ROWS:
                self.buffers[key] = buf
        buf = buf[:rows]  # [M, width], contiguous
        # (abs().amax(): 10x faster than vector_norm(inf) here, and a max is exact in any order)
        scale = x2.abs().amax(dim=1, keepdim=True).clamp_min_(_TINY)  # [M, 1]
        torch.div(x2, scale, out=buf[:, :in_features])
        return buf, scale


_workspaces = _Workspaces()


class Int8Linear(torch.nn.Module):
    """A block-invariant dynamic int8 linear layer (see the module docstring).

    Its kernel is the process's (:func:`specdec.models.kernels.int8_matmul.chosen`): oneDNN's int8 GEMM on rows
    that specdec quantizes itself, or fbgemm as described above. The weight (qint8, per channel or per
    tensor) is packed for it (for fbgemm with the pinned columns' zero weights appended) on a background
    thread (packing releases the GIL and is most of an int8 load's time); every use waits for the packing first. ``pinned=False`` runs torch's own per-pass kernel on
    the same weights instead (not block-invariant: for tests and measurements).
    """

    _packing = None  # the packing's Future; None once it is done and checked

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.kernel = int8_matmul.chosen()  # the process's kernel (specdec.models.kernels.int8_matmul), fixed
        self.width = padded_width(in_features) if self.kernel == "fbgemm" else in_features
        self.register_buffer("bias", bias.detach().float().contiguous() if bias is not None else None)
        self.pinned = True
        self._packed = None  # fbgemm's packed [out, width] weight
        self._plain = None  # the same weight packed without the pinned columns (pinned=False only)

    @classmethod
    def from_qweight(cls, qweight: torch.Tensor, bias: torch.Tensor | None = None,
                     pool: ThreadPoolExecutor | None = None) -> "Int8Linear":
        """The layer of ``qweight`` [out, in] (qint8; zero weights for the pinned columns are added), packed
        now or, given ``pool``, on it."""
        out_features, in_features = qweight.shape
        layer = cls(in_features, out_features, bias)
        if pool is None:
            layer._packed = layer._pack(qweight)
        else:
            layer._packing = pool.submit(layer._pack, qweight)
        return layer

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   per_channel: bool = True) -> "Int8Linear":
        """The layer of a float weight [out, in], quantized as ``quantize_dynamic`` quantizes it (qint8,
        symmetric, per output channel or per tensor)."""
        return cls.from_qweight(quantize_weight(weight, per_channel), bias)

    def _pack(self, qweight: torch.Tensor | DeferredQWeight):
        if self.kernel == "specdec" and isinstance(qweight, DeferredQWeight):  # the mapped values, packed in one copy
            return int8_packed.PackedInt8Weight.from_parts(qweight.parts, qweight.per_channel)
        if isinstance(qweight, DeferredQWeight):
            qweight = qweight.make()  # (on the packing thread: one weight copied at a time, not all at once)
        if not isinstance(qweight, torch.Tensor) or not qweight.is_quantized:
            raise SpecDecError(f"Int8Linear takes a qint8 weight, got {getattr(qweight, 'dtype', type(qweight))}")
        if self.kernel == "onednn":
            return int8_matmul.OnednnWeight(qweight)
        if self.kernel == "specdec":
            return int8_packed.PackedInt8Weight(qweight)
        pad = self.width - self.in_features
        padded = with_ints(qweight, torch.nn.functional.pad(qweight.int_repr(), (0, pad)))  # [out, width]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.ops.quantized.linear_prepack(padded, None)

    def wait_packed(self) -> None:
        packing = self._packing
        if packing is not None:
            self._packed = packing.result()  # re-raises a packing error here
            self._packing = None

    def weight(self) -> torch.Tensor:
        """The quantized weight [out, in] (qint8), without the pinned columns."""
        self.wait_packed()
        if self.kernel in ("onednn", "specdec"):
            return self._packed.qweight()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return qweight[:, : self.in_features]

    def _weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight(), self.bias

    def parts(self, x: torch.Tensor, widths: Sequence[int]) -> list[torch.Tensor]:
        """The output in column parts ``widths`` (a fused layer's siblings), each contiguous: specdec's int8 kernel
        writes them apart (each part but the last starting at a multiple of 32 columns), the others slice and copy."""
        if self.kernel != "specdec" or any(start % extension.GROUP for start in itertools.accumulate(widths[:-1])):
            y, start, out = self(x), 0, []
            for width in widths:
                out.append(y[..., start:start + width].contiguous())
                start += width
            return out
        self.wait_packed()
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        with threads.parallel_kernel():
            ys = self._packed.row_parts(x2 if x2.dtype == torch.float32 else x2.float(), widths, not self.pinned,
                                        self.bias)  # [[M, w_i]]
        return [y.reshape(*x.shape[:-1], width) for y, width in zip(ys, widths)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel == "specdec":  # rows quantized in the kernel, bias added there: block-invariant (per_pass: not)
            return self.parts(x, (self.out_features,))[0]
        self.wait_packed()
        shape = x.shape
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if x2.dtype != torch.float32:
            x2 = x2.float()
        if self.kernel == "onednn":  # rows quantized by specdec: block-invariant (per_pass: not)
            with threads.parallel_kernel():
                y = self._packed.rows(x2, per_pass=not self.pinned)  # [M, N]
            if self.bias is not None:
                y.add_(self.bias)
            return y.reshape(*shape[:-1], self.out_features)
        if not self.pinned:
            return self._per_pass(x2).reshape(*shape[:-1], self.out_features)
        buf, scale = _workspaces.normalized(x2, self.in_features, self.width)  # [M, K + pad], [M, 1]
        with threads.parallel_kernel():
            y = torch.ops.quantized.linear_dynamic(buf, self._packed, True)  # [M, N], reduce_range as torch's
        y.mul_(scale)
        if self.bias is not None:
            y.add_(self.bias)
        return y.reshape(*shape[:-1], self.out_features)

    def _per_pass(self, x2: torch.Tensor) -> torch.Tensor:
        """torch's dynamic int8 kernel on the same weights: one activation scale for the whole pass."""
        if self._plain is None:
            qweight = self.weight()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._plain = torch.ops.quantized.linear_prepack(contiguous_q(qweight), None)
        with threads.parallel_kernel():
            y = torch.ops.quantized.linear_dynamic(x2, self._plain, True)
        return y.add_(self.bias) if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, width={self.width}, "
                f"bias={self.bias is not None}, pinned={self.pinned}")

    def __getstate__(self):
        self.wait_packed()
        state = self.__dict__.copy()
        state["_packing"] = None
        return state
