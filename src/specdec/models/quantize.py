"""Cheaper models for CPU: dynamic int8 quantization of the linear layers.

A quantized DRAFT never changes specdec's output (only alpha and speed: the draft is any q). A
quantized TARGET is a different model, and not even a fixed one: dynamic int8 computes its activation
scales over all tokens of a forward pass, so a position's logits change with how many tokens share the
pass (1 in plain decoding, gamma + 1 in verification). Speculative decoding with a quantized target is
therefore not token-identical to the quantized target's own plain decoding (measured on the Qwen pair:
1 of 20 greedy outputs equal); specdec marks such runs ``stats.exact = False`` with the reason. A
per-token activation scale would make it block-invariant; torch's dynamic kernels do not offer one.

torch's dynamic int8 (fbgemm kernels, int8 weights, fp32 activations quantized on the fly) was the
fastest path measured on these 2-core CPUs (MODELS.md, "Faster drafts"): it keeps a step memory-bound
(5 tokens cost about one) and is 2.3-2.6x faster than bf16. torchao's CPU paths were slower than bf16.
"""

from __future__ import annotations

import warnings

import torch

from specdec.errors import SpecDecError

METHODS = {
    # name: weight observer granularity
    "int8": "per-channel",  # one scale per output row: closer to the float model at the same speed
    "int8-tensor": "per-tensor",
}


def quantize_model(model, method: str) -> None:
    """Quantize ``model`` (a LanguageModel) in place with ``method`` (see METHODS)."""
    if method not in METHODS:
        raise SpecDecError(f"unknown quantization {method!r}; use one of: {', '.join(METHODS)}")
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic

    qconfig = per_channel_dynamic_qconfig if METHODS[method] == "per-channel" else default_dynamic_qconfig
    hf = model.hf_model
    hf.float()  # dynamic int8 kernels take float32 activations
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_dynamic is deprecated upstream but present in torch 2.13
        with torch.no_grad():
            quantize_dynamic(hf, {torch.nn.Linear: qconfig}, dtype=torch.qint8, inplace=True)
    model.quantization = method
    model.name = f"{model.name}+{method}"
