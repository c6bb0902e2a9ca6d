"""Fused sibling int8 layers: the linear layers of a decoder layer that read one input (the attention's
projections, the MLP's gate and up) packed as one :class:`~specdec.models.quantized.int8_linear.Int8Linear` and run
as one kernel call, each member taking its columns of the output (:class:`Int8Slice`); and
:func:`int8_layers`, which builds a model's int8 layers from their quantized weights, fusing where it can."""

from __future__ import annotations

import itertools
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch

from specdec.models.quantized.int8_linear import Int8Linear
from specdec.models.quantized.int8_weights import DeferredQWeight, contiguous_q, is_per_channel


def _version(x: torch.Tensor) -> int:
    return -1 if x.is_inference() else x._version


#: Sibling layers that read one input in transformers' decoder layers (the attention's projections, the
#: MLP's gate and up): each set is packed as one weight and runs as one kernel call (fewer calls per step;
#: every output element is computed as it would be alone, so fusing changes no bit).
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class Int8Slice(Int8Linear):
    """One member of fused sibling layers (:data:`FUSED_SIBLINGS`): columns [start, end) of their fused
    :class:`Int8Linear`'s output. The fused output of an input is computed once and handed to each member
    (the same tensor object, at the same version, is the same input), then dropped when every member has
    taken its part."""

    def __init__(self, fused: "_Fused", start: int, end: int):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = fused.layer.in_features, end - start
        self.width = fused.layer.width
        object.__setattr__(self, "fused", fused)  # not a submodule: the fused weight is nobody's state
        self.start, self.end = start, end
        bias = fused.layer.bias
        self.register_buffer("bias", bias[start:end] if bias is not None else None)

    @property
    def pinned(self) -> bool:
        return self.fused.layer.pinned

    @pinned.setter
    def pinned(self, value: bool) -> None:
        if hasattr(self, "start"):  # (Int8Linear's __init__ is not run)
            self.fused.layer.pinned = value

    @property
    def kernel(self) -> str:
        return self.fused.layer.kernel

    def wait_packed(self) -> None:
        self.fused.layer.wait_packed()

    def weight(self) -> torch.Tensor:
        return contiguous_q(self.fused.weight()[self.start:self.end])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.output(x, self)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, columns {self.start}:{self.end} of a fused layer"


class _Fused:
    """The fused layer of a set of siblings ([start, end) columns each, in order), and the parts of its last
    input's output (until every member took its own)."""

    def __init__(self, layer: Int8Linear, bounds: list[tuple[int, int]]):
        self.layer, self.bounds = layer, bounds
        self.widths = [end - start for start, end in bounds]
        self._input = self._parts = None
        self._version, self._served = -2, set()

    def output(self, x: torch.Tensor, member: Int8Slice) -> torch.Tensor:
        if self._input is not x or self._version != _version(x) or id(member) in self._served:
            self._input, self._version, self._served = x, _version(x), set()
            # each part contiguous: a pass of several rows would get strided columns from a slice, on which
            # elementwise ops (the MLP's silu and product) run their slow strided loops (measured: silu 1.1 ms a
            # call for 8 rows of the 1.5B, 37 us for 1); specdec's int8 kernel writes the parts apart, no copy
            self._parts = dict(zip((start for start, _ in self.bounds), self.layer.parts(x, self.widths)))
        out = self._parts[member.start]
        self._served.add(id(member))
        if len(self._served) == len(self.bounds):  # every member has its part: hold nothing past the pass
            self._input = self._parts = None
        return out

    def weight(self) -> torch.Tensor:
        return self.layer.weight()


def _cat_per_channel(qweights: list[torch.Tensor]) -> torch.Tensor | None:
    """Per-channel qint8 weights [out_i, in] stacked into one [sum out_i, in]; None if any is per-tensor."""
    if not all(is_per_channel(q) for q in qweights):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(
            torch.cat([q.int_repr() for q in qweights]), torch.cat([q.q_per_channel_scales() for q in qweights]),
            torch.cat([q.q_per_channel_zero_points() for q in qweights]), 0)


def fused_set(members: list) -> _Fused | None:
    """The fused layer of ``members`` where they are all of its members, in order (one kernel call gives their
    outputs: ``fused.layer.parts(x, fused.widths)``); None otherwise."""
    fused = getattr(members[0], "fused", None)
    if not all(isinstance(m, Int8Slice) and m.fused is fused for m in members):
        return None
    return fused if [m.start for m in members] == [start for start, _ in fused.bounds] else None


def sibling_set(name: str) -> list[str] | None:
    """The layer names of the sibling set (:data:`FUSED_SIBLINGS`) that ``name`` opens, in order; None if it opens
    none."""
    parent, _, attr = name.rpartition(".")
    for siblings in FUSED_SIBLINGS:
        if attr == siblings[0]:
            return [f"{parent}.{a}" if parent else a for a in siblings]
    return None


def joined_bias(biases: list[torch.Tensor | None], outs: list[int]) -> torch.Tensor | None:
    """Sibling biases stacked (zeros for a member without one); None if no member has one."""
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else torch.zeros(n) for b, n in zip(biases, outs)])


def fused_members(layer: Int8Linear, names: list[str], outs: list[int]) -> dict[str, Int8Slice]:
    """``layer`` (siblings stacked, ``outs[i]`` rows each) served to each member ``names[i]`` as its columns."""
    ends = list(itertools.accumulate(outs))
    fused = _Fused(layer, list(zip([0] + ends[:-1], ends)))
    return {n: Int8Slice(fused, start, end) for n, (start, end) in zip(names, fused.bounds)}


def int8_layers(weights: dict[str, tuple[torch.Tensor | DeferredQWeight, torch.Tensor | None]],
                pool: ThreadPoolExecutor | None = None) -> dict[str, Int8Linear]:
    """``{layer name: (qweight [out, in], bias)}`` -> ``{layer name: Int8Linear}``, sibling sets
    (:data:`FUSED_SIBLINGS`) fused; packed now or on ``pool``, the largest weights first. A
    :class:`DeferredQWeight` (a stored model's) is made, fused siblings stacked, only when its layer packs."""
    groups: list[list[str]] = []
    taken: set[str] = set()
    for name in weights:
        names = sibling_set(name)
        if names and all(n in weights for n in names) and len({weights[n][0].shape[1] for n in names}) == 1:
            groups.append(names)
            taken.update(names)
    jobs = [([name], weights[name][0], weights[name][1]) for name in weights if name not in taken]
    for names in groups:
        members = [weights[n][0] for n in names]
        deferred = all(isinstance(w, DeferredQWeight) for w in members)
        qweight = DeferredQWeight.join(members) if deferred else _cat_per_channel(members)
        if qweight is None:  # per-tensor weights keep their own scales: not fused
            jobs.extend(([n], weights[n][0], weights[n][1]) for n in names)
            continue
        jobs.append((names, qweight, joined_bias([weights[n][1] for n in names], [weights[n][0].shape[0] for n in names])))
    out: dict[str, Int8Linear] = {}
    for names, qweight, bias in sorted(jobs, key=lambda job: -job[1].numel()):  # the largest packs first
        layer = Int8Linear.from_qweight(qweight, bias, pool)
        if len(names) == 1:
            out[names[0]] = layer
            continue
        out.update(fused_members(layer, names, [weights[n][0].shape[0] for n in names]))
    return out


def put_layers(hf, layers: dict[str, torch.nn.Module]) -> None:
    for name, module in layers.items():
        parent, _, attr = name.rpartition(".")
        setattr(hf.get_submodule(parent) if parent else hf, attr, module)
