"""qint8 weights: the quantization methods (how a linear layer's weights are observed: per output channel
or per tensor, as ``quantize_dynamic`` does) and the helpers that rebuild quantized tensors, shared by the
int8 layer (:mod:`specdec.models.quantized.int8_linear`), its fused siblings (:mod:`specdec.models.quantized.int8_fusion`) and
the stored int8 models (:mod:`specdec.models.formats.stored`)."""

from __future__ import annotations

import warnings

import torch

from specdec.errors import SpecDecError

#: torch 2.13's deprecation of the quantized tensors these weights are (specdec's int8 kernel needs none). The
#: loader's packing threads make them at once, and ``warnings.catch_warnings`` is not thread-safe (one thread's exit
#: restores the filters while another is inside its block: a stored int8 model loading on fbgemm printed it),
#: so it is silenced once, by its own text, not per call.
QUANTIZED_DEPRECATION = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor creation"
warnings.filterwarnings("ignore", message=QUANTIZED_DEPRECATION, category=UserWarning)

METHODS = {
    # name: weight observer granularity
    "int8": "per-channel",  # one scale per output row: closer to the float model at the same speed
    "int8-tensor": "per-tensor",
    # 4-bit weights in llama.cpp's Q4_K form, int8 activations (specdec's CPU kernels: AVX-512 VNNI or AVX2): about
    # half the bytes of int8, for drafts (specdec.models.quantized.int4)
    "int4": "Q4_K form",
    # a preset's GGUF as close as the kernels carry it: its Q4_K tensors in int4 exactly, the rest (Q5_0, Q6_K,
    # Q8_0: more bits) in int8; the CPU's quantized target where the CPU has AVX-512 VNNI (docs/int8_target.md)
    "int4-mixed": "Q4_K tensors int4, the rest int8",
}


def check_method(method: str) -> None:
    if method not in METHODS:
        raise SpecDecError(f"unknown quantization {method!r}; use one of: {', '.join(METHODS)}")
    # (the int4 methods also need the CPU's AVX-512 VNNI: specdec.models.quantized.int4.check_cpu)


def is_per_channel(qweight: torch.Tensor) -> bool:
    return qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)


def quantize_weight(weight: torch.Tensor, per_channel: bool = True) -> torch.Tensor:
    """A float weight [out, in] quantized as ``quantize_dynamic`` quantizes it: qint8, symmetric, one scale
    per output channel (``per_channel``) or for the tensor; the same values and scales, without packing it
    for a kernel (and unpacking it again) on the way."""
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

    observer = (per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig).weight()
    weight = weight.detach().float()
    observer(weight)
    scale, zero_point = observer.calculate_qparams()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
        if per_channel:
            return torch.quantize_per_channel(weight, scale.float(), zero_point, 0, torch.qint8)
        return torch.quantize_per_tensor(weight, float(scale), int(zero_point), torch.qint8)


def with_ints(qweight: torch.Tensor, ints: torch.Tensor) -> torch.Tensor:  # (fbgemm's packing)
    """A qint8 tensor of the int8 values ``ints`` [out, any width] with ``qweight``'s scales and zero points
    (one per output row, or one for the tensor)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
        if is_per_channel(qweight):
            return torch._make_per_channel_quantized_tensor(
                ints, qweight.q_per_channel_scales(), qweight.q_per_channel_zero_points(), 0)
        return torch._make_per_tensor_quantized_tensor(ints, qweight.q_scale(), qweight.q_zero_point())


def contiguous_q(qweight: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a (sliced) quantized weight."""
    return with_ints(qweight, qweight.int_repr().contiguous())


class DeferredQWeight:
    """A qint8 weight [out, in] made only when its layer packs (:mod:`specdec.models.formats.stored`): its int8
    values as read from the file (views of its mapping: no copy yet), scales and zero points, one part per
    sibling layer it fuses (:mod:`specdec.models.quantized.int8_fusion`). Loading then never holds a second copy of
    every weight while the packing runs: only the weights being packed (measured on the 1.5B: the load's
    peak 2 GB lower)."""

    def __init__(self, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], per_channel: bool):
        self.parts, self.per_channel = parts, per_channel  # [(ints [out_i, in], scales, zero points)]
        self.shape = torch.Size([sum(p[0].shape[0] for p in parts), parts[0][0].shape[1]])

    def numel(self) -> int:
        return self.shape.numel()

    @classmethod
    def join(cls, weights: list["DeferredQWeight"]) -> "DeferredQWeight | None":
        """Siblings stacked [sum out_i, in] (made when packed); None if any is per-tensor (kept apart)."""
        if not all(w.per_channel for w in weights):
            return None
        return cls([p for w in weights for p in w.parts], True)

    def make(self) -> torch.Tensor:
        """The qint8 tensor (its int8 values copied once, the siblings' stacked)."""
        ints, scales, zero_points = (torch.cat(xs) if len(xs) > 1 else xs[0] for xs in zip(*self.parts))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
            if self.per_channel:
                return torch._make_per_channel_quantized_tensor(ints, scales, zero_points, 0)
            return torch._make_per_tensor_quantized_tensor(ints, float(scales[0]), int(zero_points[0]))
