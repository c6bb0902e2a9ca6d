"""Quantized drafts (dynamic int8) never change the output; a quantized target is labelled."""

import copy

import pytest
import torch

import specdec
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import V, exact_joint, sampled_joint
from tiny import load_tiny, perturbed

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]


def quantized_copy(model, method="int8"):
    return specdec.load(copy.deepcopy(model.hf_model), tokenizer=model.tokenizer, name=model.name, quantize=method)


@pytest.mark.parametrize("method", ["int8", "int8-tensor"])
def test_quantized_draft_keeps_greedy_exact(method):
    target = load_tiny(eos=None, hidden=128)
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    for source in (perturbed(target, 0.05), target):
        draft = quantized_copy(source, method)
        assert draft.quantization == method and draft.name.endswith(f"+{method}")
        linear = draft.hf_model.model.layers[0].self_attn.q_proj
        assert "quantized" in type(linear).__module__  # really replaced by a dynamic int8 kernel
        for gamma in (1, 3, 6):
            out = specdec.generate(target, PROMPT, draft=draft, gamma=gamma, max_new_tokens=40)
            assert out.token_ids == plain.token_ids
    # The int8 copy of the target itself stays close to it: most of its greedy tokens are accepted.
    assert out.stats.acceptance_rate > 0.6


def test_quantized_draft_keeps_the_distribution():
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    draft = quantized_copy(perturbed(target, 0.7, seed=3))
    probs = exact_joint(target, SamplingParams(temperature=1.0))
    counts = sampled_joint(target, draft, 2000, gamma=2, temperature=1.0)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_quantized_target_depends_on_the_block_and_is_labelled_not_exact():
    """Dynamic int8 scales activations once per forward pass, so the quantized target's logits for a
    position change with the number of tokens in the pass: speculative verification (gamma + 1 tokens)
    is then not token-identical to the quantized target's own plain decoding, and specdec says so."""
    base = load_tiny(eos=None, hidden=128)
    target = quantized_copy(base)
    seq = PROMPT + [20, 21, 22, 23]

    def last_rows(model, k):
        session, start = model.start(seq)
        return session.forward(start, k)[-1]  # the last position's logits, computed in a pass of k tokens

    assert torch.allclose(last_rows(base, 1), last_rows(base, 5), atol=1e-5)  # float model: block-invariant
    assert not torch.equal(last_rows(target, 1), last_rows(target, 5))  # int8: the block changes the logits
    out = specdec.generate(target, PROMPT, draft="prompt-lookup", gamma=4, max_new_tokens=30)
    assert target.quantization == "int8" and not out.stats.exact
    assert "dynamically quantized (int8)" in out.stats.not_exact_reason and "NOT EXACT" in out.stats.summary()
    assert specdec.generate(target, PROMPT, max_new_tokens=5).stats.exact  # plain decoding is its own reference


def test_unknown_quantization():
    with pytest.raises(specdec.SpecDecError, match="unknown quantization 'int4'; use one of: int8, int8-tensor"):
        quantized_copy(load_tiny(), "int4")
