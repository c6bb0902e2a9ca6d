"""The lean attention and MLP forwards of models on specdec's extension (specdec.models.native.lean_attention): the same
logits, bit for bit, as transformers' own forwards; installed only where they apply."""

from __future__ import annotations

import pytest
import torch

from specdec.models.kernels import extension

from specdec.models.native import lean_attention
from test_quantize import SEQ, quantized_copy, steps_and_block
from tiny import load_tiny, tiny_gemma3

pytestmark = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU has neither AVX-512 VNNI nor AVX2")


def passes(model):
    """Logits of a prefill, a 5-token pass after a rolled-back detour, and 3 one-token steps; both engines."""
    out = []
    for engine in ("dynamic", "static"):
        steps, block = steps_and_block(model, SEQ, 9, 5, engine)
        out += [steps, block]
    return torch.cat(out)


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_lean_forwards_give_transformers_bits(kind, method):
    model = quantized_copy(load_tiny(kind, eos=None, hidden=128), method)
    names = {type(m).__name__ for m in model.hf_model.modules()}
    assert {f"Lean{kind.capitalize() if kind == 'llama' else 'Qwen2'}Attention",
            f"Lean{'Llama' if kind == 'llama' else 'Qwen2'}MLP"} <= names
    lean = passes(model)
    lean_attention.uninstall(model.hf_model)
    assert not any(n.startswith("Lean") for n in {type(m).__name__ for m in model.hf_model.modules()})
    assert torch.equal(lean, passes(model))


def test_the_rotary_kernel_is_transformers_arithmetic():
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    torch.manual_seed(0)
    q, k = torch.randn(2, 7, 4, 16), torch.randn(2, 7, 2, 16)
    angles = torch.randn(2, 7, 8) * 3
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    ours = extension.loaded().rotary(q, k, cos, sin)
    theirs = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    for a, b in zip(ours, theirs):
        assert a.is_contiguous() and torch.equal(a, b)


def test_other_models_keep_their_forwards():
    model = quantized_copy(tiny_gemma3(eos=None))  # q/k norms: not the plain Llama form
    assert not any(type(m).__name__.startswith("Lean") for m in model.hf_model.modules())
    plain = load_tiny("qwen2", eos=None, hidden=128)  # float: no specdec kernel, transformers' forwards
    assert not any(type(m).__name__.startswith("Lean") for m in plain.hf_model.modules())
