"""int8 models for CPU: dynamic int8 linear layers that are block-invariant.

torch's dynamic int8 keeps a decoding step memory-bound, but its activation scale is chosen over the whole
forward pass, so an int8 TARGET would not be token-identical to its own plain decoding; specdec's int8 layer
pins that range (why and how: :mod:`specdec.models.quantized.int8_linear`). This module quantizes a model with it;
the pieces:

- :mod:`~specdec.models.quantized.int8_weights`: the methods (:data:`METHODS`) and the qint8 weight helpers;
- :mod:`~specdec.models.quantized.int8_linear`: :class:`Int8Linear`, the block-invariant layer;
- :mod:`~specdec.models.quantized.int8_fusion`: sibling layers that read one input, fused into one kernel call;
- :mod:`~specdec.models.formats.stored`: a quantized model as a file (the presets' int8 cache).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from specdec.errors import SpecDecError

from specdec.models.kernels import threads
from specdec.models.quantized.int8_fusion import FUSED_SIBLINGS, Int8Slice, int8_layers, put_layers
from specdec.models.quantized.int8_linear import K_ALIGN, Int8Linear, padded_width
from specdec.models.quantized.int8_weights import METHODS, check_method, contiguous_q, quantize_weight

__all__ = ["METHODS", "check_method", "quantize_model", "quantize_hf", "quantized_weights", "mark_quantized", "pin_linears", "wait_packed",
           "Int8Linear", "Int8Slice", "FUSED_SIBLINGS", "K_ALIGN", "padded_width", "int8_layers"]


def quantize_model(model, method: str) -> None:
    """Quantize ``model`` (a LanguageModel) in place with ``method`` (see METHODS)."""
    check_method(method)
    quantize_hf(model.hf_model, method)
    mark_quantized(model, method)


def quantize_hf(hf, method: str) -> None:
    """Quantize the linear layers of a transformers model in place into :class:`Int8Linear` layers (the
    weights as ``quantize_dynamic`` makes them, :func:`quantized_weights`, each packed once; float32 first:
    the kernels take float32 activations)."""
    check_method(method)
    hf.float()
    if method == "int4-mixed":
        raise SpecDecError("quantize='int4-mixed' follows the tensor types of a preset's GGUF (Q4_K in int4, the rest "
                           "in int8); this model has none: use int4 or int8")
    if method == "int4":
        from specdec.models.quantized.int4 import check_cpu, int4_layers, int4_weights

        check_cpu(method)

        put_layers(hf, int4_layers(int4_weights(hf, free_floats=True)))
        return
    put_layers(hf, int8_layers(quantized_weights(hf, method, free_floats=True)))


def quantized_weights(hf, method: str, free_floats: bool = False) -> dict[str, tuple[torch.Tensor, Any]]:
    """``{layer name: (qweight [out, in], float32 bias or None)}`` for the linear layers ``quantize_dynamic``
    would quantize (the exact type ``nn.Linear``), with its values and scales, without building layers:
    what :func:`quantize_hf` packs and a conversion saves (:func:`~specdec.models.formats.stored.save_quantized`).
    ``free_floats``: each layer's float weight is dropped once quantized (the layer is then only good for
    replacing or saving), so the float model and its int8 copy are never both held."""
    check_method(method)
    if method.startswith("int4"):
        raise SpecDecError("quantized_weights makes int8 weights; int4 weights: specdec.models.quantized.int4.int4_weights")
    per_channel = METHODS[method] == "per-channel"
    out = {}
    for name, module in hf.named_modules():
        if type(module) is not torch.nn.Linear:  # (quantize_dynamic's match: the exact type)
            continue
        out[name] = (quantize_weight(module.weight, per_channel),
                     None if module.bias is None else module.bias.detach().float())
        if free_floats:
            module.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)  # (a tied table stays)
    return out


def mark_quantized(model, method: str) -> None:
    """Label ``model`` (a LanguageModel whose linear layers are :class:`Int8Linear`) as quantized and run its
    attention row by row (:mod:`specdec.models.native.row_attention`): it is then block-invariant."""
    model.quantization = method
    model.name = f"{model.name}+{method}"
    model.block_invariant = all(not isinstance(m, DynamicLinear) for m in model.hf_model.modules())
    model.configure(model.engine, model.cuda_graphs, model.compile)  # installs the row attention
    threads.install(model.hf_model)  # short passes: only the int8 kernels in parallel


def pin_linears(hf) -> None:
    """Replace every torch dynamic int8 linear layer of ``hf`` by :class:`Int8Linear` layers (same weights)."""
    weights = {}
    for name, module in hf.named_modules():
        if isinstance(module, DynamicLinear):
            weight, bias = module._weight_bias()
            weights[name] = (contiguous_q(weight), bias)
    put_layers(hf, int8_layers(weights))


def wait_packed(model) -> None:
    """Wait until every int8 layer of ``model`` (a transformers model) has its weight packed."""
    for module in model.modules():
        if hasattr(module, "wait_packed"):
            module.wait_packed()
