"""Cheaper models for CPU: dynamic int8 quantization of the linear layers.

A quantized DRAFT never changes specdec's output (only alpha and speed: the draft is any q). A
quantized TARGET is a different model, and not even a fixed one: dynamic int8 computes its activation
scales over all tokens of a forward pass, so a position's logits change with how many tokens share the
pass (1 in plain decoding, gamma + 1 in verification). Speculative decoding with a quantized target is
therefore not token-identical to the quantized target's own plain decoding (README, "Quantized drafts",
has the measurement); specdec marks such runs ``stats.exact = False`` with the reason. A
per-token activation scale would make it block-invariant; torch's dynamic kernels do not offer one.

torch's dynamic int8 (fbgemm kernels, int8 weights, fp32 activations quantized on the fly) is the CPU path
specdec uses for cheap drafts: it keeps a step memory-bound, so verifying a few tokens costs about one;
the measurements that chose it over bf16 and torchao are in the README ("Benchmark").
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from specdec.errors import SpecDecError

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
    """Quantize the linear layers of a transformers model in place (float32 first: the kernels take it)."""
    check_method(method)
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if METHODS[method] == "per-channel" else default_dynamic_qconfig
    hf.float()  # dynamic int8 kernels take float32 activations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_dynamic is deprecated upstream but present in torch 2.13
        with torch.no_grad():
            quantize_dynamic(hf, {torch.nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)


def mark_quantized(model, method: str) -> None:
    model.quantization = method
    model.name = f"{model.name}+{method}"


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
        # the load returns: README, "Loading the presets")
        _packer = ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()), thread_name_prefix="specdec-pack")
    return _packer


class BackgroundPackedLinear(DynamicLinear):
    """torch's dynamic int8 Linear whose weight is packed on a background thread; every use of the
    weight (forward, ``weight()``, ``state_dict``, copying) waits for the packing first."""

    _packing = None  # the packing's Future; None once it is done and checked

    def pack_in_background(self, pool: ThreadPoolExecutor, qweight: torch.Tensor, bias: torch.Tensor | None) -> None:
        # (packing warns of nothing: the worker leaves the process-wide warning filters alone, which
        # catch_warnings in several threads at once would not)
        self._packing = pool.submit(self.set_weight_bias, qweight, bias)

    def wait_packed(self) -> None:
        packing = self._packing
        if packing is not None:
            packing.result()  # re-raises a packing error here
            self._packing = None

    def forward(self, x):
        self.wait_packed()
        return super().forward(x)

    def _weight_bias(self):
        self.wait_packed()
        return super()._weight_bias()

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.wait_packed()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def __getstate__(self):
        self.wait_packed()
        return super().__getstate__()


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
        if not isinstance(mod, DynamicLinear):
            continue
        weight, bias = mod._weight_bias()
        info = {"in": mod.in_features, "out": mod.out_features, "bias": bias is not None}
        tensors[f"{name}.weight_int8"] = weight.int_repr().contiguous()
        if weight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
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

    Each linear layer becomes a dynamic int8 one made from the stored int8 weights, which start packing
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
    linears: dict[str, BackgroundPackedLinear] = {}
    rest: dict[str, torch.Tensor] = {}
    with safe_open(str(path), framework="pt") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
        meta = f.metadata() or {}
        if meta.get("specdec_quantization") != method:
            raise SpecDecError(f"{path} holds {meta.get('specdec_quantization')!r} weights, expected {method!r}")
        modules = json.loads(meta[_META_KEY])
        # the largest first: the 0.5B's lm_head packs for as long as all its layers together, so it
        # packs on one thread while the layers pack on the other
        for name, info in sorted(modules.items(), key=lambda item: -item[1]["in"] * item[1]["out"]):
            weight = f.get_tensor(f"{name}.weight_int8")
            scales = f.get_tensor(f"{name}.weight_scales")
            zero_points = f.get_tensor(f"{name}.weight_zero_points")
            if "axis" in info:
                qweight = torch._make_per_channel_quantized_tensor(weight, scales, zero_points, info["axis"])
            else:
                qweight = torch._make_per_tensor_quantized_tensor(weight, float(scales[0]), int(zero_points[0]))
            bias = f.get_tensor(f"{name}.bias") if info["bias"] else None
            module = BackgroundPackedLinear(1, 1, bias_=info["bias"], dtype=torch.qint8)  # a 1x1 placeholder
            module.in_features, module.out_features = info["in"], info["out"]
            module.pack_in_background(pool, qweight, bias)
            linears[name] = module
            del weight, qweight
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
    for name, module in linears.items():
        parent, _, attr = name.rpartition(".")
        setattr(hf.get_submodule(parent) if parent else hf, attr, module)
    return fill(hf, rest, folder, path)  # the tensors read from the file become the weights
