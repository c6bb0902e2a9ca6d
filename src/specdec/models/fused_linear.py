"""Sibling float linear layers run as one GEMM on a GPU: the attention's q, k and v projections, the MLP's
gate and up (:data:`~specdec.models.quantized.int8_fusion.FUSED_SIBLINGS`, the same sets the int8 target fuses on CPU).

At batch 1 a GPU step is bound by kernel count and latency, not by weights: the 1.5B's k and v projections
(0.8 MB each) take as long as its q projection, and 15 of a layer's 19 kernels move little data (device-side
trace, docs/round_graphs.md). One GEMM over the concatenated weights replaces three (two in the MLP).

The decoder layers of transformers call their siblings one after the other on one input, first to last
(``q_proj(x)``, ``k_proj(x)``, ``v_proj(x)``); so the first member (:class:`FusedFirst`) computes the fused
output and hands the others (:class:`FusedMember`) their columns through a small shared holder, which the
last one empties. That keeps transformers' forward code as it is and traces as one graph under
``torch.compile(fullgraph=True)``. A member called with another input than the first got raises (a model
whose forward calls its siblings in another order is not fused wrongly in silence).

Each output column is the dot product it was before, so on CPU in fp32 the logits are unchanged bit for bit
(tested); on a GPU cuBLAS may pick another kernel for the wider GEMM, so the last bits may differ from the
unfused model's, as between any two GEMM shapes. Plain and speculative decoding run the same fused model.
"""

from __future__ import annotations

from typing import Any

import torch

from specdec.models.quantized.int8_fusion import FUSED_SIBLINGS


class _Holder:
    """What the first member of a fused set leaves for the others: its input and the other members' outputs."""

    def __init__(self) -> None:
        self.input: torch.Tensor | None = None
        self.parts: tuple[torch.Tensor, ...] = ()


class FusedFirst(torch.nn.Module):
    """The first of fused siblings: one GEMM for all of them; returns its own columns, keeps the rest."""

    def __init__(self, layers: list[torch.nn.Linear], holder: _Holder):
        super().__init__()
        first = layers[0]
        bias = first.bias is not None
        self.fused = torch.nn.Linear(first.in_features, sum(l.out_features for l in layers), bias=bias,
                                     device=first.weight.device, dtype=first.weight.dtype)
        with torch.no_grad():
            self.fused.weight.copy_(torch.cat([l.weight for l in layers]))  # [sum out, in]
            if bias:
                self.fused.bias.copy_(torch.cat([l.bias for l in layers]))
        self.sizes = [l.out_features for l in layers]
        self.in_features, self.out_features = first.in_features, first.out_features
        object.__setattr__(self, "holder", holder)  # not a submodule

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.fused(x).split(self.sizes, dim=-1)  # views of [..., sum out]
        self.holder.input, self.holder.parts = x, parts
        return parts[0]


class FusedMember(torch.nn.Module):
    """A later sibling: its columns of the fused output the first member computed for the same input."""

    def __init__(self, layer: torch.nn.Linear, holder: _Holder, index: int, last: bool):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.index, self.last = index, last
        object.__setattr__(self, "holder", holder)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        holder = self.holder
        if holder.input is not x:
            raise RuntimeError("a fused sibling layer was called before its first member, or on another input; "
                               "this model's forward does not call them in order (load it without fusion)")
        out = holder.parts[self.index]
        if self.last:
            holder.input, holder.parts = None, ()
        return out


def fuse_siblings(hf_model: Any) -> int:
    """Replace every set of plain ``nn.Linear`` siblings (:data:`FUSED_SIBLINGS`: same input size, all with or all
    without bias) by one fused GEMM, in place; already fused or quantized layers are left alone. Returns the
    number of sets fused."""
    fused = 0
    for module in list(hf_model.modules()):
        for names in FUSED_SIBLINGS:
            layers = [getattr(module, name, None) for name in names]
            if not all(type(l) is torch.nn.Linear for l in layers):
                continue
            if len({(l.in_features, l.bias is None, l.weight.dtype, l.weight.device) for l in layers}) != 1:
                continue
            holder = _Holder()
            setattr(module, names[0], FusedFirst(layers, holder))
            for i, name in enumerate(names[1:], start=1):
                setattr(module, name, FusedMember(layers[i], holder, i, last=i == len(names) - 1))
            fused += 1
    return fused
