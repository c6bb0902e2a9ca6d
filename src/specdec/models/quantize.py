"""int8 models for CPU: dynamic int8 linear layers that are block-invariant.

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
:mod:`specdec.models.row_attention`; together they make the int8 model's logits for a k-token block
identical to k one-token steps, which is what exact verification needs.

The appended columns are padded to a multiple of :data:`K_ALIGN` (measured: docs/int8_target.md).
A :class:`Int8Linear` keeps one workspace per thread and width (``[rows, K + pad]``, the pinned columns
written once), so a forward pass allocates nothing but its output.
"""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from specdec.errors import SpecDecError
from specdec.models import int8_kernels, threads

METHODS = {
    # name: weight observer granularity
    "int8": "per-channel",  # one scale per output row: closer to the float model at the same speed
    "int8-tensor": "per-tensor",
}


def check_method(method: str) -> None:
    if method not in METHODS:
        raise SpecDecError(f"unknown quantization {method!r}; use one of: {', '.join(METHODS)}")


def quantize_model(model, method: str) -> None:
    """Quantize ``model`` (a LanguageModel) in place with ``method`` (see METHODS)."""
    check_method(method)
    quantize_hf(model.hf_model, method)
    mark_quantized(model, method)


def quantize_hf(hf, method: str) -> None:
    """Quantize the linear layers of a transformers model in place into :class:`Int8Linear` layers (the
    weights as ``quantize_dynamic`` makes them; float32 first: the kernels take float32 activations)."""
    check_method(method)
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if METHODS[method] == "per-channel" else default_dynamic_qconfig
    hf.float()  # dynamic int8 kernels take float32 activations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_dynamic is deprecated upstream but present in torch 2.13
        with torch.no_grad():
            quantize_dynamic(hf, {torch.nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    pin_linears(hf)


def mark_quantized(model, method: str) -> None:
    """Label ``model`` (a LanguageModel whose linear layers are :class:`Int8Linear`) as quantized and run its
    attention row by row (:mod:`specdec.models.row_attention`): it is then block-invariant."""
    model.quantization = method
    model.name = f"{model.name}+{method}"
    model.block_invariant = all(not isinstance(m, DynamicLinear) for m in model.hf_model.modules())
    model.configure(model.engine, model.cuda_graphs, model.compile)  # installs the row attention
    threads.install(model.hf_model)  # short passes: only the int8 kernels in parallel


# ------------------------------------------------------------------------------------------------
# A quantized model as a file: what the presets cache for ``quantize="int8"`` (specdec.models.presets).
#
# The int8 weights, their scales and zero points are stored exactly as quantize_dynamic made them from
# the float32 weights, so loading gives the same packed weights as quantizing at load time did, without
# a float32 copy of the linear layers on the way. Everything else (embeddings, norms, biases) is stored
# in float32, as it runs.

_META_KEY = "specdec_quantized_linears"


# Packing an int8 weight for fbgemm (``linear_prepack``) is most of an int8 load's time and releases the
# GIL. A loaded layer packs on a background thread and waits for
# its packing when first used, so the packing overlaps whatever comes next (loading the target).
_packer: ThreadPoolExecutor | None = None


def _packing_pool() -> ThreadPoolExecutor:
    global _packer
    if _packer is None:
        # as many threads as torch computes with (measured against one thread and against packing before
        # the load returns: docs/presets.md, "Loading the presets")
        _packer = ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()), thread_name_prefix="specdec-pack")
    return _packer


#: The pinned columns are padded so that K + pad is a multiple of this (fbgemm's K blocking; measured).
K_ALIGN = 8
_TINY = int8_kernels._TINY  # the smallest row scale (an all-zero row then stays zero instead of becoming NaN)
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


def _version(x: torch.Tensor) -> int:
    return -1 if x.is_inference() else x._version


class Int8Linear(torch.nn.Module):
    """A block-invariant dynamic int8 linear layer (see the module docstring).

    Its kernel is the process's (:func:`specdec.models.int8_kernels.chosen`): oneDNN's int8 GEMM on rows
    that specdec quantizes itself, or fbgemm as described above. The weight (qint8, per channel or per
    tensor) is packed for it (for fbgemm with the pinned columns' zero weights appended) on a background
    thread (packing releases the GIL and is most of an int8 load's time); every use waits for the packing first. ``pinned=False`` runs torch's own per-pass kernel on
    the same weights instead (not block-invariant: for tests and measurements).
    """

    _packing = None  # the packing's Future; None once it is done and checked

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.kernel = int8_kernels.chosen()  # the process's kernel (specdec.models.int8_kernels), fixed
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
        from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

        observer = (per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig).weight()
        weight = weight.detach().float()
        observer(weight)
        scale, zero_point = observer.calculate_qparams()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
            if per_channel:
                qweight = torch.quantize_per_channel(weight, scale.float(), zero_point, 0, torch.qint8)
            else:
                qweight = torch.quantize_per_tensor(weight, float(scale), int(zero_point), torch.qint8)
        return cls.from_qweight(qweight, bias)

    def _pack(self, qweight: torch.Tensor):
        if not isinstance(qweight, torch.Tensor) or not qweight.is_quantized:
            raise SpecDecError(f"Int8Linear takes a qint8 weight, got {getattr(qweight, 'dtype', type(qweight))}")
        if self.kernel == "onednn":
            return int8_kernels.OnednnWeight(qweight)
        pad = self.width - self.in_features
        padded = _with_ints(qweight, torch.nn.functional.pad(qweight.int_repr(), (0, pad)))  # [out, width]
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
        if self.kernel == "onednn":
            return self._packed.qweight()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qweight, _ = torch.ops.quantized.linear_unpack(self._packed)
        return qweight[:, : self.in_features]

    def _weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.weight(), self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
                self._plain = torch.ops.quantized.linear_prepack(_contiguous_q(qweight), None)
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


def _per_channel(qweight: torch.Tensor) -> bool:
    return qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric)


def _with_ints(qweight: torch.Tensor, ints: torch.Tensor) -> torch.Tensor:  # (fbgemm's packing)
    """A qint8 tensor of the int8 values ``ints`` [out, any width] with ``qweight``'s scales and zero points
    (one per output row, or one for the tensor)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
        if _per_channel(qweight):
            return torch._make_per_channel_quantized_tensor(
                ints, qweight.q_per_channel_scales(), qweight.q_per_channel_zero_points(), 0)
        return torch._make_per_tensor_quantized_tensor(ints, qweight.q_scale(), qweight.q_zero_point())


def _contiguous_q(qweight: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of a (sliced) quantized weight."""
    return _with_ints(qweight, qweight.int_repr().contiguous())


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
        return _contiguous_q(self.fused.weight()[self.start:self.end])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.output(x, self)[..., self.start:self.end]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, columns {self.start}:{self.end} of a fused layer"


class _Fused:
    """The fused layer of a set of siblings, and the output of its last input (until every member took it)."""

    def __init__(self, layer: Int8Linear, members: int):
        self.layer, self.members = layer, members
        self._input = self._output = None
        self._version, self._served = -2, set()

    def output(self, x: torch.Tensor, member: Int8Slice) -> torch.Tensor:
        if self._input is not x or self._version != _version(x) or id(member) in self._served:
            self._input, self._version, self._served = x, _version(x), set()
            self._output = self.layer(x)
        out = self._output
        self._served.add(id(member))
        if len(self._served) == self.members:  # every member has its part: hold nothing past the pass
            self._input = self._output = None
        return out

    def weight(self) -> torch.Tensor:
        return self.layer.weight()


def _cat_per_channel(qweights: list[torch.Tensor]) -> torch.Tensor | None:
    """Per-channel qint8 weights [out_i, in] stacked into one [sum out_i, in]; None if any is per-tensor."""
    if not all(_per_channel(q) for q in qweights):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch._make_per_channel_quantized_tensor(
            torch.cat([q.int_repr() for q in qweights]), torch.cat([q.q_per_channel_scales() for q in qweights]),
            torch.cat([q.q_per_channel_zero_points() for q in qweights]), 0)


def int8_layers(weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]],
                pool: ThreadPoolExecutor | None = None) -> dict[str, Int8Linear]:
    """``{layer name: (qweight [out, in], bias)}`` -> ``{layer name: Int8Linear}``, sibling sets
    (:data:`FUSED_SIBLINGS`) fused; packed now or on ``pool``, the largest weights first."""
    groups: list[list[str]] = []
    taken: set[str] = set()
    for name in weights:
        parent, _, attr = name.rpartition(".")
        for siblings in FUSED_SIBLINGS:
            if attr == siblings[0]:
                names = [f"{parent}.{a}" if parent else a for a in siblings]
                if all(n in weights for n in names) and len({weights[n][0].shape[1] for n in names}) == 1:
                    groups.append(names)
                    taken.update(names)
    jobs = [([name], weights[name][0], weights[name][1]) for name in weights if name not in taken]
    for names in groups:
        qweight = _cat_per_channel([weights[n][0] for n in names])
        if qweight is None:  # per-tensor weights keep their own scales: not fused
            jobs.extend(([n], weights[n][0], weights[n][1]) for n in names)
            continue
        biases = [weights[n][1] for n in names]
        bias = None
        if any(b is not None for b in biases):
            bias = torch.cat([b if b is not None else torch.zeros(weights[n][0].shape[0])
                              for n, b in zip(names, biases)])
        jobs.append((names, qweight, bias))
    out: dict[str, Int8Linear] = {}
    for names, qweight, bias in sorted(jobs, key=lambda job: -job[1].numel()):  # the largest packs first
        layer = Int8Linear.from_qweight(qweight, bias, pool)
        if len(names) == 1:
            out[names[0]] = layer
            continue
        fused, start = _Fused(layer, len(names)), 0
        for n in names:
            rows = weights[n][0].shape[0]
            out[n] = Int8Slice(fused, start, start + rows)
            start += rows
    return out


def _put_layers(hf, layers: dict[str, torch.nn.Module]) -> None:
    for name, module in layers.items():
        parent, _, attr = name.rpartition(".")
        setattr(hf.get_submodule(parent) if parent else hf, attr, module)


def pin_linears(hf) -> None:
    """Replace every torch dynamic int8 linear layer of ``hf`` by :class:`Int8Linear` layers (same weights)."""
    weights = {}
    for name, module in hf.named_modules():
        if isinstance(module, DynamicLinear):
            weight, bias = module._weight_bias()
            weights[name] = (_contiguous_q(weight), bias)
    _put_layers(hf, int8_layers(weights))


def wait_packed(model) -> None:
    """Wait until every int8 layer of ``model`` (a transformers model) has its weight packed."""
    for module in model.modules():
        if hasattr(module, "wait_packed"):
            module.wait_packed()


def expand_blocks(k: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """float32 ``k * d`` with one float16 ``d`` per block of 32 along a row (exact: see presets)."""
    rows, cols = k.shape
    out = torch.empty(rows, cols // 32, 32, dtype=torch.float32)
    out.copy_(k.view(rows, -1, 32))  # one float32 buffer, scaled in place (the table is 0.5 GB for the 0.5B)
    out.mul_(d.to(torch.float32).unsqueeze(-1))
    return out.view(rows, cols)


def save_quantized(hf, path, method: str, blocks: dict | None = None) -> None:
    """Write a model quantized by :func:`quantize_hf` to one safetensors file at ``path``.

    ``blocks``: ``{state key: (k, d)}`` for float tensors stored as int8 ``k`` and float16 block
    scales ``d`` (:func:`expand_blocks` gives the float32 tensor back exactly) instead of float32.
    """
    import json

    from safetensors.torch import save_file

    blocks = blocks or {}
    tensors: dict[str, torch.Tensor] = {}
    modules: dict[str, dict] = {}
    for name, mod in hf.named_modules():
        if not isinstance(mod, (DynamicLinear, Int8Linear)):
            continue
        weight, bias = mod._weight_bias()
        info = {"in": mod.in_features, "out": mod.out_features, "bias": bias is not None}
        tensors[f"{name}.weight_int8"] = weight.int_repr().contiguous()
        if _per_channel(weight):
            info["axis"] = int(weight.q_per_channel_axis())
            tensors[f"{name}.weight_scales"] = weight.q_per_channel_scales().contiguous()
            tensors[f"{name}.weight_zero_points"] = weight.q_per_channel_zero_points().contiguous()
        else:
            tensors[f"{name}.weight_scales"] = torch.tensor([weight.q_scale()], dtype=torch.float64)
            tensors[f"{name}.weight_zero_points"] = torch.tensor([weight.q_zero_point()], dtype=torch.int64)
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().contiguous()
        modules[name] = info
    prefixes = tuple(f"{n}." for n in modules)
    seen: set[int] = set()
    for key, value in hf.state_dict().items():
        if key.startswith(prefixes) or not isinstance(value, torch.Tensor):
            continue
        if value.data_ptr() in seen:  # a tied tensor: stored once, tied again by the model on load
            continue
        seen.add(value.data_ptr())
        if key in blocks:
            k, d = blocks[key]
            if not torch.equal(expand_blocks(k, d), value):
                raise SpecDecError(f"the block form of {key} does not give its values back")
            tensors[f"{key}.k_int8"], tensors[f"{key}.d_float16"] = k.contiguous(), d.contiguous()
        else:
            tensors[key] = value.detach().contiguous()
    meta = {"format": "pt", "specdec_quantization": method, _META_KEY: json.dumps(modules)}
    save_file(tensors, str(path), metadata=meta)


def load_quantized(folder, path, method: str):
    """Build the transformers model in ``folder`` (config) with the quantized weights of ``path``.

    Each linear layer becomes an :class:`Int8Linear` made from the stored int8 weights, which start packing
    on background threads at once; the model skeleton is then made without weights
    (``accelerate.init_empty_weights``; importing the model's code takes seconds, while the weights pack),
    the layers put in and the other tensors filled in from the file: no float32 copy of a linear layer is
    ever made.
    """
    import json

    from safetensors import safe_open

    from specdec.models.checkpoint import empty_model, fill

    check_method(method)
    pool = _packing_pool()
    weights: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    rest: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
        meta = f.metadata() or {}
        if meta.get("specdec_quantization") != method:
            raise SpecDecError(f"{path} holds {meta.get('specdec_quantization')!r} weights, expected {method!r}")
        modules = json.loads(meta[_META_KEY])
        for name, info in modules.items():
            weight = f.get_tensor(f"{name}.weight_int8")
            scales = f.get_tensor(f"{name}.weight_scales")
            zero_points = f.get_tensor(f"{name}.weight_zero_points")
            if "axis" in info:
                qweight = torch._make_per_channel_quantized_tensor(weight, scales, zero_points, info["axis"])
            else:
                qweight = torch._make_per_tensor_quantized_tensor(weight, float(scales[0]), int(zero_points[0]))
            bias = f.get_tensor(f"{name}.bias") if info["bias"] else None
            weights[name] = (qweight, bias)
            del weight, qweight
        # packed on background threads, the largest first: the 0.5B's lm_head packs for as long as all its
        # layers together, so it packs on one thread while the layers pack on the other
        linears = int8_layers(weights, pool)
        del weights
        prefixes = tuple(f"{n}." for n in modules)
        for key in f.keys():
            if key.startswith(prefixes) or key.endswith(".d_float16"):
                continue
            if key.endswith(".k_int8"):
                base = key[: -len(".k_int8")]
                rest[base] = expand_blocks(f.get_tensor(key), f.get_tensor(f"{base}.d_float16"))
            else:
                rest[key] = f.get_tensor(key)
    hf = empty_model(folder, torch.float32)
    _put_layers(hf, linears)
    return fill(hf, rest, folder, path)  # the tensors read from the file become the weights
