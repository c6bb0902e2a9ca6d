"""The decoder step of models on specdec's extension (specdec.models.native.decoder_step): every decoder layer of a cached
pass in one extension call, with transformers' logits bit for bit; used only where it applies."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.models.native import decoder_step
from specdec.models.kernels import extension
from specdec.models.native import lean_attention
from specdec.models.kernels import threads
from specdec.models.quantized.int8_linear import Int8Linear
from test_lean_attention import passes
from test_quantize import SEQ, quantized_copy
from tiny import load_tiny, tiny_gemma3

pytestmark = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU has neither AVX-512 VNNI nor AVX2")


@pytest.fixture
def counted(monkeypatch):
    """The number of passes the decoder step computed (not None) in the test, so far."""
    used = [0]
    original = decoder_step.step

    def counting(*args, **kwargs):
        logits = original(*args, **kwargs)
        used[0] += logits is not None
        return logits

    monkeypatch.setattr(decoder_step, "step", counting)
    return used


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_decoder_step_gives_transformers_bits(kind, method, n_threads, counted):
    torch.set_num_threads(n_threads)
    model = quantized_copy(load_tiny(kind, eos=None, hidden=128), method)
    assert decoder_step.decoder_step(model.hf_model) is not None
    ours = passes(model)  # a prefill, steps and blocks after rolled-back detours, both engines
    assert counted[0] > 0  # the dynamic engine's cached passes ran it
    decoder_step.set_enabled(model.hf_model, False)
    lean_attention.uninstall(model.hf_model)  # transformers' own forwards, module by module
    used = counted[0]
    theirs = passes(model)
    assert counted[0] == used  # none ran it
    assert torch.equal(ours, theirs)


def test_generation_is_unchanged_and_uses_the_step(counted):
    target = quantized_copy(load_tiny("qwen2", eos=None, hidden=128), "int4")
    draft = quantized_copy(load_tiny("qwen2", eos=None, hidden=128, seed=5), "int8")
    fast = specdec.generate(target, SEQ[:9], draft=draft, gamma=3, max_new_tokens=30)
    assert counted[0] >= fast.stats.target_calls + fast.stats.draft_calls - 2  # all but the two prefills
    for model in (target, draft):
        decoder_step.set_enabled(model.hf_model, False)
    slow = specdec.generate(target, SEQ[:9], draft=draft, gamma=3, max_new_tokens=30)
    plain = specdec.generate(target, SEQ[:9], max_new_tokens=30)
    assert fast.token_ids == slow.token_ids == plain.token_ids


def test_the_step_keeps_the_serial_threads():
    """Where idle threads sleep the pass runs serial outside the GEMMs and gives the threads back after."""
    torch.set_num_threads(2)
    model = quantized_copy(load_tiny("llama", eos=None, hidden=128), "int8")
    session, _ = model.start(SEQ, 64)
    session.prefill(SEQ[:5])
    session.extend(SEQ[5:8], 3)
    assert torch.get_num_threads() == 2 and threads.kernel_threads() is None


def test_other_models_run_transformers_forward(counted):
    assert decoder_step.decoder_step(quantized_copy(tiny_gemma3(eos=None)).hf_model) is None  # q/k norms, windows
    assert decoder_step.decoder_step(load_tiny("qwen2", eos=None, hidden=128).hf_model) is None  # float
    model = quantized_copy(load_tiny("qwen2", eos=None, hidden=128), "int8")
    session, _ = model.start(SEQ, 64)
    session.prefill(SEQ[:5])
    session.extend(SEQ[5:6], 1)
    assert counted[0] == 1
    for layer in model.hf_model.modules():
        if isinstance(layer, Int8Linear):
            layer.pinned = False  # torch's per-pass scale (measurements), after the step was built: not the step
    session.extend(SEQ[6:7], 1)
    assert counted[0] == 1
    assert decoder_step.decoder_step(quantized_copy(load_tiny("qwen2", eos=None, hidden=128), "int8").hf_model)


def test_biases_in_every_projection_give_transformers_bits():
    """Llama with attention and MLP biases (o_proj and down_proj too): the step adds each where transformers does."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny import VOCAB, tiny_tokenizer

    torch.manual_seed(3)
    hf = LlamaForCausalLM(LlamaConfig(vocab_size=len(VOCAB), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
                                      max_position_embeddings=256, bos_token_id=1, eos_token_id=None))
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.5)
    model = specdec.load(hf, tokenizer=tiny_tokenizer(), name="tiny-biased", quantize="int8")
    assert decoder_step.decoder_step(model.hf_model) is not None
    ours = passes(model)
    decoder_step.set_enabled(model.hf_model, False)
    lean_attention.uninstall(model.hf_model)
    assert torch.equal(ours, passes(model))
