"""int4 weights for specdec's AVX-512 VNNI kernel (``csrc/int4_gemm_avx512.cpp``): about half the bytes of int8.

A decoding step on a CPU streams every weight once, so its time follows the weights' bytes: the 0.5B draft in int8
spends two thirds of a step in its int8 GEMM. Here a linear layer's weight has llama.cpp's Q4_K form, ``w = d * sc *
q - dmin * m`` (q 4 bits a value; sc, m 6 bits per :data:`SUB` input columns; d, dmin float16 per :data:`SUPER`):
4.6 bits a weight, and a GGUF's Q4_K tensors come in exactly as stored (:func:`from_q4k`). The kernel multiplies it
with the activations quantized per row to int8, exactly as the int8 kernel quantizes them, sums each sub-block's
products exactly in int32 and folds the sub-blocks into float32 in a fixed order. A row's output depends on its own
input row only, so an int4 model is block-invariant like the int8 one (its verification passes give its plain
steps' bits).

A draft's weights only change how often its tokens are accepted, never what the target generates: specdec's
default CPU draft is the 0.5B in int4 where the CPU has AVX-512 VNNI (``qwen2.5-coder-0.5b:int4@65536``, its head cut
to the first 65,536 ids: :mod:`specdec.models.quantized.draft_head`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from specdec.errors import SpecDecError
from specdec.models.kernels import extension
from specdec.models.quantized.int8_fusion import fused_members, joined_bias, sibling_set
from specdec.models.quantized.int8_linear import Int8Linear

#: Input columns per sub-block (one 6-bit sc and m each) and per super-block (one float16 d and dmin each).
SUB, SUPER = 32, 256


def check_cpu(method: str | None) -> None:
    """Refuse an int4 method (int4, int4-mixed) where the CPU cannot run the kernel, with the fix."""
    if method and method.startswith("int4") and extension.turned_off():
        raise SpecDecError(f"quantize={method!r} runs on specdec's CPU kernels, which SPECDEC_KERNELS=off turns off: "
                           "unset it, or use int8 (e.g. qwen2.5-coder-0.5b:int8)")
    if method and method.startswith("int4") and not extension.cpu_supported():
        raise SpecDecError(f"quantize={method!r} runs on specdec's CPU kernels, which need a CPU with AVX-512 VNNI or "
                           "AVX2 (with FMA and F16C); this one has neither: use int8 (e.g. qwen2.5-coder-0.5b:int8)")


class Int4Weight:
    """A linear weight [out, in] in the int4 kernel's layout: ``packed`` [ceil(out / 32), in_p / 4, 64] uint8 (two
    values a byte), ``dmins`` [ceil(out / 32), in_p / 256, 64] float16 (32 d, then 32 dmin) and ``scs``
    [ceil(out / 32), in_p / 32, 64] uint8 (32 sc, then 32 m), in_p = in rounded up to :data:`SUPER`."""

    def __init__(self, packed: torch.Tensor, dmins: torch.Tensor, scs: torch.Tensor, out_features: int,
                 in_features: int):
        self.packed, self.dmins, self.scs = packed, dmins, scs
        self.out_features, self.in_features = out_features, in_features

    @classmethod
    def quantize(cls, weight: torch.Tensor) -> "Int4Weight":
        """A float weight [out, in] quantized into the Q4_K form (per sub-block min and max; see ``quantize4``)."""
        ext = extension.loaded()
        return cls(*ext.layout4(*ext.quantize4(weight.detach().float().contiguous())), *weight.shape)

    @classmethod
    def from_q4k(cls, blocks: np.ndarray, out_features: int, in_features: int) -> "Int4Weight":
        """A GGUF Q4_K tensor's raw blocks [out, in / 256 * 144] uint8, carried over exactly: the same d, dmin, sc,
        m and q, so the kernel multiplies by exactly the values llama.cpp does."""
        return cls(*extension.loaded().layout4(*q4k_parts(blocks, out_features, in_features)), out_features,
                   in_features)

    def parts(self) -> tuple[torch.Tensor, ...]:
        """The Q4_K form back: (q [out, in_p] uint8, d, dmin [out, in_p / 256] float16, sc, m [out, in_p / 32] uint8)."""
        groups, lanes = self.packed.shape[0], self.packed.shape[1]
        nibbles = torch.stack([self.packed & 15, self.packed >> 4], 2).view(groups, lanes, 2, 16, 4)
        q = nibbles.permute(0, 2, 3, 1, 4).reshape(groups * 32, lanes * 4)  # [N32, in_p]
        dm = self.dmins.view(groups, -1, 2, 32).permute(2, 0, 3, 1).reshape(2, groups * 32, -1)
        sm = self.scs.view(groups, -1, 2, 32).permute(2, 0, 3, 1).reshape(2, groups * 32, -1)
        n = self.out_features
        return q[:n], dm[0, :n], dm[1, :n], sm[0, :n], sm[1, :n]

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel multiplies by, float32 [out, in] (``d * sc * q - dmin * m``)."""
        q, d, dmin, sc, m = (t.float() for t in self.parts())
        scale = d.repeat_interleave(SUPER // SUB, 1) * sc  # [out, in_p / 32]
        offset = dmin.repeat_interleave(SUPER // SUB, 1) * m
        weight = q * scale.repeat_interleave(SUB, 1) - offset.repeat_interleave(SUB, 1)
        return weight[:, : self.in_features]

    def select(self, rows: torch.Tensor) -> "Int4Weight":
        """The weight of output rows ``rows`` ([R] long), the same values (a draft head over part of the vocabulary).

        Every 32 rows of the result that are one whole packed group here, in order, are that group's bytes as they
        are (the first 65,536 ids of a head: 2,048 groups); only the others are unpacked and laid out again (the
        end-of-sequence ids after them), so a cut head takes milliseconds, not a relayout of the whole head."""
        rows = rows.cpu()
        total, pieces, start = int(rows.numel()), [], 0
        while start < total:
            run = self._whole_groups(rows, start)  # whole groups from new group start // 32 on
            if run:
                g = int(rows[start]) // 32
                pieces.append(tuple(t[g: g + run] for t in (self.packed, self.dmins, self.scs)))
                start += 32 * run
                continue
            chunk = rows[start: start + 32]  # rows of one new group, not one whole group here: laid out again
            groups = torch.unique(chunk // 32)  # [G] the groups they come from
            part = Int4Weight(self.packed[groups], self.dmins[groups], self.scs[groups], groups.numel() * 32,
                              self.in_features).parts()
            local = torch.searchsorted(groups, chunk // 32) * 32 + chunk % 32  # the rows within those groups
            pieces.append(tuple(extension.loaded().layout4(*(t[local] for t in part))))
            start += 32
        packed, dmins, scs = (torch.cat(ts) if len(ts) > 1 else ts[0].clone() for ts in zip(*pieces))
        return Int4Weight(packed, dmins, scs, total, self.in_features)

    def _whole_groups(self, rows: torch.Tensor, start: int) -> int:
        """How many whole groups of this weight ``rows[start:]`` begins with, in order (0 if it does not)."""
        first = int(rows[start])
        if first % 32:
            return 0
        limit = min((int(rows.numel()) - start) // 32, self.out_features // 32 - first // 32)  # (a full last group)
        if limit <= 0:
            return 0
        span = rows[start: start + 32 * limit] - first  # [32 * limit] 0, 1, 2, ... while whole groups follow
        same = torch.nonzero(span != torch.arange(32 * limit))
        return (int(same[0]) if same.numel() else 32 * limit) // 32

    def qweight(self) -> torch.Tensor:
        raise SpecDecError("an int4 layer has no qint8 weight; dequantized() gives its float32 values")

    def rows(self, x2: torch.Tensor, per_pass: bool = False, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x2 [M, in] float32 -> [M, out] float32, bias added."""
        return self.row_parts(x2, (), per_pass, bias)[0]

    def row_parts(self, x2: torch.Tensor, widths: Sequence[int], per_pass: bool = False,
                  bias: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The output in column parts ``widths`` (each but the last starting at a multiple of 32), each [M, w_i]
        contiguous (see :meth:`specdec.models.quantized.int8_packed.PackedInt8Weight.row_parts`)."""
        if per_pass:
            raise SpecDecError("an int4 layer quantizes every activation row on its own; it has no per-pass mode")
        return extension.loaded().rows4(x2.contiguous(), self.packed, self.dmins, self.scs, bias,
                                           self.out_features, extension.amx_from(), list(widths))


#: Bytes of one Q4_K block (256 values): d, dmin (float16), 12 bytes of packed 6-bit sc and m, 128 of nibbles.
Q4K_BLOCK_BYTES = 144


def q4k_parts(blocks: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, ...]:
    """Raw Q4_K blocks [rows, cols / 256 * 144] -> (q [rows, cols] uint8, d, dmin [rows, cols / 256] float16, sc,
    m [rows, cols / 32] uint8), as GGML lays them out: per block d, dmin, then sc and m of its 8 sub-blocks in 12
    bytes (sub-blocks 0-3 in the low 6 bits of bytes 0-3 and 4-7; 4-7 in the nibbles of bytes 8-11 and the top 2
    bits of bytes 0-7), then 128 bytes: per 64 values, 32 bytes whose low nibbles are the first 32, high the next."""
    if cols % SUPER:
        raise SpecDecError(f"a Q4_K tensor's rows are whole blocks of {SUPER} values, not {cols}")
    b = np.ascontiguousarray(blocks).reshape(rows, cols // SUPER, Q4K_BLOCK_BYTES)
    d = b[:, :, 0:2].copy().view(np.float16)[..., 0]
    dmin = b[:, :, 2:4].copy().view(np.float16)[..., 0]
    s = b[:, :, 4:16].astype(np.uint8)  # [rows, blocks, 12]
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], -1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], -1)
    qs = b[:, :, 16:].reshape(rows, cols // SUPER, 4, 32)
    q = np.stack([qs & 15, qs >> 4], 3).reshape(rows, cols)  # per 64: 32 low nibbles, then 32 high
    return (torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(np.ascontiguousarray(d)),
            torch.from_numpy(np.ascontiguousarray(dmin)), torch.from_numpy(sc.reshape(rows, -1).copy()),
            torch.from_numpy(m.reshape(rows, -1).copy()))


class Int4Linear(Int8Linear):
    """A linear layer with an :class:`Int4Weight`, run by specdec's extension's int4 GEMM (rows quantized to int8
    in the kernel, bias added there): block-invariant, fused siblings served apart like an int8 layer's."""

    def __init__(self, weight: Int4Weight, bias: torch.Tensor | None = None):
        super().__init__(weight.in_features, weight.out_features, bias)
        self.kernel, self.width = "specdec", weight.in_features  # (the int8 layer's specdec path, with this weight)
        self._packed = weight

    def dequantized(self) -> torch.Tensor:
        return self._packed.dequantized()

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, int4 (Q4_K form), "
                f"bias={self.bias is not None}")


#: A layer or sibling set as it runs: (layer names, rows of each, the weight, the bias).
Int4Set = tuple[list[str], list[int], Int4Weight, "torch.Tensor | None"]


def int4_sets(weights: dict[str, tuple[Int4Weight, torch.Tensor | None]]) -> list[Int4Set]:
    """``{layer name: (Int4Weight, bias)}`` -> the layers as they run, ``[(names, rows of each, weight, bias)]``: a
    sibling set (:data:`FUSED_SIBLINGS`) whose members' rows fill whole packed groups of 32 as one weight (their
    packed rows stacked, their biases joined), every other layer alone. A conversion stores them so
    (:func:`~specdec.models.formats.stored.save_quantized`): a load then stacks nothing."""
    sets: list[Int4Set] = []
    done: set[str] = set()
    for name, (weight, bias) in weights.items():
        if name in done:
            continue
        names = sibling_set(name) or [name]
        members = [weights.get(n) for n in names]
        if len(names) == 1 or any(m is None or m[0].in_features != weight.in_features
                                  or m[0].out_features % 32 for m in members):
            sets.append(([name], [weight.out_features], weight, bias))
            done.add(name)
            continue
        outs = [m[0].out_features for m in members]
        fused = Int4Weight(*(torch.cat([getattr(m[0], key) for m in members]) for key in ("packed", "dmins", "scs")),
                           sum(outs), weight.in_features)
        sets.append((names, outs, fused, joined_bias([m[1] for m in members], outs)))
        done.update(names)
    return sets


def set_layers(sets: list[Int4Set]) -> dict[str, Int8Linear]:
    """:func:`int4_sets`' sets -> ``{layer name: layer}`` (a fused set's members served from one layer)."""
    out: dict[str, Int8Linear] = {}
    for names, outs, weight, bias in sets:
        layer = Int4Linear(weight, bias)
        out.update({names[0]: layer} if len(names) == 1 else fused_members(layer, names, outs))
    return out


def int4_layers(weights: dict[str, tuple[Int4Weight, torch.Tensor | None]]) -> dict[str, Int8Linear]:
    """``{layer name: (Int4Weight, bias)}`` -> ``{layer name: layer}``, sibling sets fused (:func:`int4_sets`)."""
    return set_layers(int4_sets(weights))


def int4_weights(hf, free_floats: bool = False, gguf_path=None, mixed: bool = False) -> dict:
    """``{layer name: (weight, float32 bias or None)}`` for the linear layers of a transformers model (the exact type
    ``nn.Linear``, as the int8 methods take them), each weight an :class:`Int4Weight`. With ``gguf_path`` (the GGUF the
    model was dequantized from) a layer stored there as Q4_K comes in exactly, checked value for value against the
    float weight; ``mixed``: every other layer (stored with more bits: Q5_0, Q6_K, Q8_0) becomes a qint8 weight (the
    ``int8`` method's), else it is quantized into int4. ``free_floats``: each float weight dropped once converted."""
    from specdec.models.quantized.int8_weights import quantize_weight

    stored = _gguf_linears(hf, gguf_path) if gguf_path is not None else {}
    out = {}
    for name, module in hf.named_modules():
        if type(module) is not torch.nn.Linear:
            continue
        weight, raw = None, stored.get(name)
        if raw is not None and raw.tensor_type.name == "Q4_K":
            exact = Int4Weight.from_q4k(np.asarray(raw.data), *module.weight.shape)
            weight = exact if torch.equal(exact.dequantized(), module.weight.detach().float()) else None
        if weight is None:
            weight = quantize_weight(module.weight, True) if mixed else Int4Weight.quantize(module.weight)
        out[name] = (weight, None if module.bias is None else module.bias.detach().float())
        if free_floats:
            module.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)  # (a tied table stays)
    return out


def _gguf_linears(hf, gguf_path) -> dict:
    """``{linear layer name: its GGUF tensor}`` by gguf-py's tensor name map of the file's architecture."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    field = reader.fields["general.architecture"]
    arch = bytes(field.parts[field.data[0]]).decode()
    archs = {name: key for key, name in gguf.MODEL_ARCH_NAMES.items()}
    if arch not in archs:
        return {}
    blocks = int(reader.fields[f"{arch}.block_count"].parts[-1][0])
    names = gguf.get_tensor_name_map(archs[arch], blocks)
    tensors = {t.name: t for t in reader.tensors}
    found = {}
    for name, module in hf.named_modules():
        gguf_name = names.get_name(name) if type(module) is torch.nn.Linear else None
        if gguf_name and f"{gguf_name}.weight" in tensors:
            found[name] = tensors[f"{gguf_name}.weight"]
    return found
