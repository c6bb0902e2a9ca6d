"""Sibling projections fused into one GEMM each (specdec.models.fused_linear, the GPU path's models): the same
logits bit for bit on CPU in fp32, one graph under torch.compile, the same tokens through graphed rounds, and a
clear error where a forward calls the siblings out of order."""

import pytest
import torch

import specdec
from specdec.decoding import prepare_steps
from specdec.models.fused_linear import FusedFirst, FusedMember, fuse_siblings
from tiny import captured, load_tiny, perturbed, tiny_gemma3, tiny_model, tiny_tokenizer

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]


def fused_copy(kind):
    """A tiny model and the same weights with its siblings fused."""
    def build():
        return tiny_gemma3(sliding_window=4, eos=None).hf_model if kind == "gemma3" else tiny_model(kind, eos=None)

    base, fused = build().eval(), build().eval()
    assert fuse_siblings(fused) == 2 * fused.config.num_hidden_layers  # q/k/v and gate/up in every layer
    return base, fused


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma3"])
def test_fused_siblings_give_the_same_logits_and_compile_as_one_graph(kind):
    base, fused = fused_copy(kind)
    layer = fused.model.layers[0]
    assert isinstance(layer.self_attn.q_proj, FusedFirst) and isinstance(layer.mlp.up_proj, FusedMember)
    ids = torch.randint(0, 50, (1, 9))
    with torch.inference_mode():
        reference = base(ids).logits
        assert torch.equal(fused(ids).logits, reference)  # each column is the same dot product
        compiled = torch.compile(lambda x: fused(x).logits, backend="eager", fullgraph=True)  # no graph break
        assert torch.equal(compiled(ids), reference)
        assert torch.equal(compiled(ids[:, :4]), base(ids[:, :4]).logits)
    assert fuse_siblings(fused) == 0  # fused once: a second call finds nothing to fuse


def test_fused_siblings_give_plain_tokens_through_graphed_rounds(emulated_graphs):
    base, fused = fused_copy("qwen2")
    plain = specdec.generate(specdec.load(base, tokenizer=tiny_tokenizer()), PROMPT, max_new_tokens=20).token_ids
    target = captured(specdec.load(fused, tokenizer=tiny_tokenizer()))
    draft = captured(perturbed(load_tiny("qwen2", eos=None), 0.05))
    fuse_siblings(draft.hf_model)
    prepare_steps(target, [draft], [4], 64)
    out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=20)
    assert out.token_ids == plain and out.stats.rounds_graphed == out.stats.target_calls


def test_a_sibling_called_out_of_order_is_an_error():
    _, fused = fused_copy("llama")
    attention = fused.model.layers[0].self_attn
    x = torch.randn(1, 3, fused.config.hidden_size)
    with pytest.raises(RuntimeError, match="does not call them in order"):
        attention.k_proj(x)
    attention.q_proj(x)
    with pytest.raises(RuntimeError, match="another input"):
        attention.k_proj(x.clone())
