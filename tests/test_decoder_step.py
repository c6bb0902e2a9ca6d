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


def count_passes(monkeypatch, name: str) -> list[int]:
    """[the number of passes decoder_step.<name> computed (not None) in the test, so far]."""
    used = [0]
    original = getattr(decoder_step, name)

    def counting(*args, **kwargs):
        logits = original(*args, **kwargs)
        used[0] += logits is not None
        return logits

    monkeypatch.setattr(decoder_step, name, counting)
    return used


@pytest.fixture
def counted(monkeypatch):
    """The one-sequence passes the decoder step computed."""
    return count_passes(monkeypatch, "step")


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_decoder_step_gives_transformers_bits(kind, method, n_threads, counted):
    torch.set_num_threads(n_threads)
    model = quantized_copy(load_tiny(kind, eos=None, hidden=128), method)
    runner = decoder_step.decoder_step(model.hf_model)
    assert runner is not None
    assert runner.norm_lanes() == ATEN_LANES.get(torch.backends.cpu.get_cpu_capability(), runner.norm_lanes())
    ours = passes(model)  # a prefill, steps and blocks after rolled-back detours, both engines
    assert counted[0] > 0  # the dynamic engine's cached passes ran it
    decoder_step.set_enabled(model.hf_model, False)
    lean_attention.uninstall(model.hf_model)  # transformers' own forwards, module by module
    used = counted[0]
    theirs = passes(model)
    assert counted[0] == used  # none ran it
    assert torch.equal(ours, theirs)


#: The float vector width of ATen's sums per CPU capability (what the extension's RMSNorm must reproduce).
ATEN_LANES = {"AVX2": 8, "AVX512": 16}


@pytest.mark.parametrize("hidden", [12, 64, 100, 896, 1536, 3584, 70000])
def test_the_extensions_rms_norm_has_atens_bits(hidden):
    from specdec.models.native.causal_lm import NativeRMSNorm

    norm = NativeRMSNorm(hidden, 1e-6)
    norm.weight = torch.nn.Parameter(torch.randn(hidden, generator=torch.Generator().manual_seed(hidden)),
                                     requires_grad=False)
    lanes = decoder_step.norm_lanes(norm)
    assert lanes == ATEN_LANES.get(torch.backends.cpu.get_cpu_capability(), lanes) and lanes in (8, 16)
    ext = extension.loaded()
    generator = torch.Generator().manual_seed(1)
    other_differs = False
    for rows in (1, 3, 64, 300):  # a step, a verification, prefills (different lengths, one algorithm a row)
        h = torch.randn(1, rows, hidden, generator=generator) * 10 ** torch.randint(-3, 4, (1, rows, 1), generator=generator)
        expected = norm(h)
        assert torch.equal(ext.rms_norm_lanes(h, norm.weight, 1e-6, lanes).view(h.shape), expected)
        other = ext.rms_norm_lanes(h, norm.weight, 1e-6, 24 - lanes).view(h.shape)
        other_differs |= not torch.equal(other, expected)
    assert other_differs or hidden < 16  # (the other width sums in another order: the check tells them apart)
    with pytest.raises(RuntimeError, match="lanes 8 or 16"):
        ext.rms_norm_lanes(h, norm.weight, 1e-6, 4)


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


@pytest.fixture
def counted_rows(monkeypatch):
    """The ragged batch passes the decoder step computed."""
    return count_passes(monkeypatch, "step_packed")


def ragged_passes(model):
    """Logits of a batch session's passes: prompts of 3 to 9 tokens in four slots (one kept in part, as the prefix
    cache starts a row), ragged feeds of 0 to 5 tokens, a rollback, a row leaving (the last slot moved into its
    place), and a long prefill into a slot while the others hold their rows."""
    from specdec.models.sessions.batch_session import BatchSession

    ids = SEQ + SEQ[1:]  # 81 ids
    session = BatchSession(model, 4, 128)
    out = [session.prefill(slot, ids[slot: slot + 3 + 2 * slot]) for slot in range(4)]  # [V] each
    kept = session.read_row(1)
    session.write_row(2, kept, 3)  # slot 2 starts from slot 1's first 3 positions
    out.append(session.prefill(2, ids[1:4] + ids[20:25], start=3))
    feeds = [torch.tensor(ids[10:15]), torch.tensor(ids[15:16]), torch.tensor([], dtype=torch.long),
             torch.tensor(ids[16:19])]
    out += session.extend(feeds, [5, 1, 0, 2])
    fed = session.last_pass_tokens  # 9 tokens packed, 4 rows x 5 padded
    session.rollback(0, session.lengths[0] - 3)  # three of the five rejected
    out += session.extend([torch.tensor(ids[30:32]), torch.tensor(ids[32:36]), torch.tensor(ids[36:37]),
                           torch.tensor(ids[37:38])], [2, 4, 1, 1])
    session.move(3, 1)  # slot 1's row left
    out += session.extend([torch.tensor(ids[40:41]), torch.tensor(ids[41:43]), torch.tensor(ids[43:44])], [1, 2, 1])
    out.append(session.prefill(3, ids[:70]))  # a long prompt (wider than a serial pass) into the free slot
    out += session.extend([torch.tensor(ids[44:45])] * 4, [1] * 4)
    return torch.cat([o.reshape(-1, o.shape[-1]) for o in out]), fed


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_ragged_batch_passes_give_transformers_bits(kind, method, n_threads, counted_rows):
    """A batch session's passes (rows at their own lengths, some fed nothing) through the decoder step, packed
    without padding, give transformers' padded forward's logits bit for bit (and so the same keys and values after),
    feeding only the rows' own tokens."""
    torch.set_num_threads(n_threads)
    model = quantized_copy(load_tiny(kind, eos=None, hidden=128), method)
    ours, packed = ragged_passes(model)
    assert counted_rows[0] >= 6 and packed == 9  # every pass after the first (which allocates the buffers)
    decoder_step.set_enabled(model.hf_model, False)
    lean_attention.uninstall(model.hf_model)
    used = counted_rows[0]
    theirs, padded = ragged_passes(model)
    assert counted_rows[0] == used and padded == 4 * 5
    assert torch.equal(ours, theirs)
