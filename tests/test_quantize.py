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


def _int8_weight(out_features=48, in_features=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g)
    scales = w.abs().amax(dim=1) / 127
    return torch.quantize_per_channel(w, scales, torch.zeros(out_features, dtype=torch.long), 0, torch.qint8)


def test_background_packed_linear_waits_for_its_packing_and_equals_torchs():
    """A preset's int8 layer packs its weight on a thread (specdec.models.quantize); its first use waits."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from torch.ao.nn.quantized.dynamic import Linear

    from specdec.models.quantize import BackgroundPackedLinear

    qweight, bias = _int8_weight(), torch.randn(48)
    reference = Linear(32, 48)
    reference.set_weight_bias(qweight, bias)
    gate = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(gate.wait)  # the packing queues behind this job: not packed until the gate opens
        layer = BackgroundPackedLinear(1, 1)
        layer.in_features, layer.out_features = 32, 48
        layer.pack_in_background(pool, qweight, bias)
        assert not layer._packing.done()
        threading.Timer(0.2, gate.set).start()
        x = torch.randn(3, 32)
        assert torch.equal(layer(x), reference(x))  # forward waited for the packing
        assert layer._packing is None
        assert torch.equal(layer.weight().int_repr(), qweight.int_repr()) and torch.equal(layer.bias(), bias)
        # state_dict and copies wait too
        gate.clear()
        pool.submit(gate.wait)
        other = BackgroundPackedLinear(1, 1)
        other.pack_in_background(pool, qweight, bias)
        threading.Timer(0.2, gate.set).start()
        weight, got_bias = other.state_dict()["_packed_params._packed_params"]
        assert torch.equal(weight.int_repr(), qweight.int_repr()) and torch.equal(got_bias, bias)
    assert torch.equal(copy.deepcopy(layer)(x), reference(x))


def test_background_packing_error_is_raised_at_first_use():
    from concurrent.futures import ThreadPoolExecutor

    from specdec.models.quantize import BackgroundPackedLinear

    with ThreadPoolExecutor(max_workers=1) as pool:
        layer = BackgroundPackedLinear(1, 1)
        layer.pack_in_background(pool, torch.randn(4, 4), None)  # not a quantized tensor: packing fails
        with pytest.raises(RuntimeError, match="linear_prepack"):  # the packing's own error, not another
            layer(torch.randn(1, 1))
