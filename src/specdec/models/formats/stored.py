"""A quantized model as a file: what the presets cache for ``quantize="int8"`` (specdec.models.formats.presets).

The int8 weights, their scales and zero points are stored exactly as quantize_dynamic made them from
the float32 weights, so loading gives the same packed weights as quantizing at load time did, without
a float32 copy of the linear layers on the way. Everything else (embeddings, norms, biases) is stored
in float32, as it runs.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from specdec.errors import SpecDecError
from specdec.models.quantized.int8_fusion import int8_layers, put_layers
from specdec.models.quantized.int8_linear import Int8Linear
from specdec.models.quantized.int8_weights import DeferredQWeight, check_method, is_per_channel

_META_KEY = "specdec_quantized_linears"
_TABLES_KEY = "specdec_int4_tables"
_INT4_PARTS = ("packed", "dmins", "scs")  # an Int4Weight's tensors, stored as "<name>.int4_<part>"


def _int4_tensors(name: str, weight) -> dict[str, torch.Tensor]:
    """An Int4Weight's tensors under ``name`` as the file holds them."""
    return {f"{name}.int4_{part}": getattr(weight, part).contiguous() for part in _INT4_PARTS}


def _read_int4(f, name: str, out_features: int, in_features: int):
    """The Int4Weight stored under ``name`` in the open safetensors file ``f``."""
    from specdec.models.quantized.int4 import Int4Weight

    return Int4Weight(*(f.get_tensor(f"{name}.int4_{part}") for part in _INT4_PARTS), out_features, in_features)


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


def expand_blocks(k: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """float32 ``k * d`` with one float16 ``d`` per block of 32 along a row (exact: see presets)."""
    rows, cols = k.shape
    out = torch.empty(rows, cols // 32, 32, dtype=torch.float32)
    out.copy_(k.view(rows, -1, 32))  # one float32 buffer, scaled in place (the table is 0.5 GB for the 0.5B)
    out.mul_(d.to(torch.float32).unsqueeze(-1))
    return out.view(rows, cols)


def save_quantized(hf, path, method: str, blocks: dict | None = None, weights: dict | None = None) -> None:
    """Write a model quantized by :func:`~specdec.models.quantized.quantize.quantize_hf` to one safetensors file at ``path``.

    ``blocks``: ``{state key: (k, d)}`` for float tensors stored as int8 ``k`` and float16 block
    scales ``d`` (:func:`expand_blocks` gives the float32 tensor back exactly) instead of float32.
    ``weights``: ``{layer name: (qweight, bias)}`` (:func:`~specdec.models.quantized.quantize.quantized_weights`)
    for a model whose linear layers are still float: saved as those layers quantized, nothing packed.
    """
    import json

    from safetensors.torch import save_file

    blocks = blocks or {}
    if weights is None:
        weights = {name: mod._weight_bias() for name, mod in hf.named_modules()
                   if isinstance(mod, (DynamicLinear, Int8Linear))}
    tensors: dict[str, torch.Tensor] = {}
    modules: dict[str, dict] = {}
    int4 = {name: wb for name, wb in weights.items() if not isinstance(wb[0], torch.Tensor)}  # Int4Weights
    if int4:  # as the kernel reads them, sibling sets stacked as they run (the first member's name, "members")
        from specdec.models.quantized.int4 import int4_sets

        for names, outs, weight, bias in int4_sets(int4):
            modules[names[0]] = {"in": weight.in_features, "out": weight.out_features, "bias": bias is not None}
            if len(names) > 1:
                modules[names[0]].update(members=names, outs=outs)
            tensors.update(_int4_tensors(names[0], weight))
            if bias is not None:
                tensors[f"{names[0]}.bias"] = bias.detach().contiguous()
    for name, (weight, bias) in weights.items():
        if name in int4:
            continue
        info = {"in": int(weight.shape[1]), "out": int(weight.shape[0]), "bias": bias is not None}
        tensors[f"{name}.weight_int8"] = weight.int_repr().contiguous()
        if is_per_channel(weight):
            info["axis"] = int(weight.q_per_channel_axis())
            tensors[f"{name}.weight_scales"] = weight.q_per_channel_scales().contiguous()
            tensors[f"{name}.weight_zero_points"] = weight.q_per_channel_zero_points().contiguous()
        else:
            tensors[f"{name}.weight_scales"] = torch.tensor([weight.q_scale()], dtype=torch.float64)
            tensors[f"{name}.weight_zero_points"] = torch.tensor([weight.q_zero_point()], dtype=torch.int64)
        if bias is not None:
            tensors[f"{name}.bias"] = bias.detach().contiguous()
        modules[name] = info
    prefixes = tuple(f"{n}." for n in weights)
    tables: dict[str, list[int]] = {}  # the Q4_K tables' [rows, cols]
    seen: set[int] = set()
    for key, value in hf.state_dict().items():
        if key.startswith(prefixes) or not isinstance(value, torch.Tensor):
            continue
        if value.data_ptr() in seen:  # a tied tensor: stored once, tied again by the model on load
            continue
        seen.add(value.data_ptr())
        if key in blocks and not isinstance(blocks[key], tuple):  # an Int4Weight (a Q4_K table: checked by the caller)
            tables[key] = [blocks[key].out_features, blocks[key].in_features]
            tensors.update(_int4_tensors(key, blocks[key]))
        elif key in blocks:
            k, d = blocks[key]
            if not torch.equal(expand_blocks(k, d), value):
                raise SpecDecError(f"the block form of {key} does not give its values back")
            tensors[f"{key}.k_int8"], tensors[f"{key}.d_float16"] = k.contiguous(), d.contiguous()
        else:
            tensors[key] = value.detach().contiguous()
    meta = {"format": "pt", "specdec_quantization": method, _META_KEY: json.dumps(modules),
            _TABLES_KEY: json.dumps(tables)}
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

    from specdec.models.formats.checkpoint import empty_model, fill

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
        int4: dict = {}  # the int4 layers (an int4 variant may keep some in int8: int4-mixed)
        stacked: list = []  # (the int4 layers stored as they run: sibling sets stacked)
        keys = set(f.keys())
        for name, info in modules.items():
            if f"{name}.int4_packed" in keys:
                weight = _read_int4(f, name, info["out"], info["in"])
                bias = f.get_tensor(f"{name}.bias") if info["bias"] else None
                if "members" in info:
                    stacked.append((info["members"], info["outs"], weight, bias))
                else:
                    int4[name] = (weight, bias)  # (a file from before sets were stored: stacked below)
                continue
            if "axis" in info and info["axis"] != 0:
                raise SpecDecError(f"{path}: {name} is quantized along axis {info['axis']}; expected 0 (output rows)")
            parts = [(f.get_tensor(f"{name}.weight_int8"), f.get_tensor(f"{name}.weight_scales"),
                      f.get_tensor(f"{name}.weight_zero_points"))]
            bias = f.get_tensor(f"{name}.bias") if info["bias"] else None
            weights[name] = (DeferredQWeight(parts, per_channel="axis" in info), bias)  # made as it packs
        # packed on background threads, the largest first: the 0.5B's lm_head packs for as long as all its
        # layers together, so it packs on one thread while the layers pack on the other
        linears = int8_layers(weights, pool) if weights else {}
        if int4 or stacked:  # stored as the kernel reads them: nothing to pack
            from specdec.models.quantized.int4 import int4_sets, set_layers

            linears.update(set_layers(stacked + int4_sets(int4)))
        del weights
        prefixes = tuple(f"{n}." for info_name, info in modules.items() for n in info.get("members", [info_name]))
        tables = json.loads(meta.get(_TABLES_KEY, "{}"))
        stored: dict = {}  # tables in their stored form: {key: (k, d) or Int4Weight}
        for key in f.keys():
            if key.startswith(prefixes) or key.endswith((".d_float16", ".int4_dmins", ".int4_scs")):
                continue
            if key.endswith(".k_int8"):
                base = key[: -len(".k_int8")]
                stored[base] = (f.get_tensor(key), f.get_tensor(f"{base}.d_float16"))
            elif key.endswith(".int4_packed") and key[: -len(".int4_packed")] in tables:
                base = key[: -len(".int4_packed")]
                stored[base] = _read_int4(f, base, *tables[base])
            else:
                rest[key] = f.get_tensor(key)
    from specdec.models.native import causal_lm

    hf = causal_lm.model_for(folder) if causal_lm.wanted() else None
    if hf is None:
        hf = empty_model(folder, torch.float32)
    put_layers(hf, linears)
    from specdec.models.quantized.block_embedding import stored_embedding

    for key, form in stored.items():  # the input embedding keeps its form; any other table is expanded
        if not stored_embedding(hf, key, form):
            rest[key] = form.dequantized() if not isinstance(form, tuple) else expand_blocks(*form)
    return fill(hf, rest, folder, path)  # the tensors read from the file become the weights
