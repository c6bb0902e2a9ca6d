"""int8 models: quantized drafts never change the output; an int8 target is block-invariant (a k-token pass
gives each position the logits of k one-token steps, bit for bit), so speculative decoding with it is exact."""

import copy

import pytest
import torch

import specdec
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import V, exact_joint, sampled_joint
from specdec.models.kernels import int8_matmul
from specdec.models.quantized.quantize import Int8Linear
from tiny import load_tiny, perturbed, tiny_gemma3

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
        assert isinstance(linear, Int8Linear) and linear.pinned  # really replaced by the int8 kernel
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


KERNELS = int8_matmul.available()  # each kernel this machine can run is tested


@pytest.fixture
def kernel(request):
    """Int8 layers built inside the test run ``request.param``'s kernel; the process's choice is restored after."""
    before = int8_matmul._chosen
    int8_matmul.use(request.param)
    yield request.param
    int8_matmul._chosen = before


def int8_tiny(kind):
    if kind == "gemma3":  # sliding window 6: the prefixes below reach past it
        return quantized_copy(tiny_gemma3(eos=None))
    return quantized_copy(load_tiny(kind, eos=None, hidden=128))


def steps_and_block(model, seq, prefix, k, engine="dynamic"):
    """The logits [k, V] of seq[prefix : prefix + k] computed by k one-token steps, and by one k-token pass,
    each after a detour that is rolled back (the cache then holds stale positions past the prefix)."""
    model.configure(engine)
    out = []
    for widths in ([1] * k, [k]):
        session, _ = model.start(seq, len(seq) + 16)
        session.prefill(seq[:prefix])
        session.extend(seq[prefix + 1: prefix + 4], 1)  # a detour, then rolled back
        session.rollback(prefix)
        rows, at = [], prefix
        for w in widths:
            rows.append(session.extend(seq[at: at + w], w))
            at += w
        session.close()
        out.append(torch.cat(rows))
    model.configure("dynamic")
    return out


SEQ = [1] + [4 + (7 * i) % 90 for i in range(40)]


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kind", ["qwen2", "llama", "gemma3"])
def test_int8_block_equals_one_token_steps_bit_for_bit(kind, threads, kernel):
    torch.set_num_threads(threads)
    model = int8_tiny(kind)
    assert model.block_invariant
    assert {m.kernel for m in model.hf_model.modules() if isinstance(m, Int8Linear)} == {kernel}
    for engine in ("dynamic", "static"):
        for prefix in (3, 9, 17):  # gemma3: past its sliding window of 6
            for k in range(2, 10):
                steps, block = steps_and_block(model, SEQ, prefix, k, engine)
                assert torch.equal(steps, block), (engine, prefix, k, (steps - block).abs().max().item())


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
def test_the_per_pass_scale_breaks_block_invariance(kernel):
    """The planted bug: one activation scale per pass in place of the row's own (same weights, same kernel)."""
    model = int8_tiny("qwen2")
    steps, block = steps_and_block(model, SEQ, 9, 6)
    assert torch.equal(steps, block)
    for layer in model.hf_model.modules():
        if isinstance(layer, Int8Linear):
            layer.pinned = False
    steps, block = steps_and_block(model, SEQ, 9, 6)
    assert not torch.equal(steps, block)
    assert torch.allclose(steps, block, atol=0.5)  # the same model, only rounded differently



def test_int8_decoding_passes_run_serial_outside_the_kernels(monkeypatch):
    """Where OpenMP's threads sleep, a decoding pass of an int8 model runs its small ops on one thread and its
    int8 kernels on the caller's threads; a prefill wider than SERIAL_WIDTH keeps them all. The logits are
    the same bits either way, and the threads come back when a pass raises."""
    from specdec.models.kernels import threads

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(2)
    model = int8_tiny("qwen2")
    seen: dict[str, list[int]] = {"ops": [], "kernels": []}
    model.hf_model.model.norm.register_forward_hook(lambda *a: seen["ops"].append(torch.get_num_threads()))
    from specdec.models.quantized import int8_packed

    def spying(kernel):
        def spy(*args, **kwargs):
            seen["kernels"].append(torch.get_num_threads())
            return kernel(*args, **kwargs)
        return spy

    # whichever kernel the process runs: fbgemm's op, or specdec's (every layer: its row_parts) / oneDNN row call
    monkeypatch.setattr(torch.ops.quantized, "linear_dynamic", spying(torch.ops.quantized.linear_dynamic), raising=False)
    monkeypatch.setattr(int8_packed.PackedInt8Weight, "row_parts", spying(int8_packed.PackedInt8Weight.row_parts))
    monkeypatch.setattr(int8_matmul.OnednnWeight, "rows", spying(int8_matmul.OnednnWeight.rows))
    seq = SEQ + SEQ[1:] + SEQ[1:]  # 121 tokens
    session, _ = model.start(seq, len(seq) + 8)
    for ids, wide in ((seq[:threads.SERIAL_WIDTH + 6], True), (seq[70:71], False), (seq[71:76], False)):
        seen["ops"].clear()
        seen["kernels"].clear()
        session.extend(ids, 1) if session.length else session.prefill(ids)
        assert seen["ops"] == [2 if wide else 1] and set(seen["kernels"]) == {2}, (len(ids), seen)
        assert torch.get_num_threads() == 2 and threads.kernel_threads() is None
    session.close()

    serial = steps_and_block(model, SEQ, 9, 6)
    monkeypatch.setattr(threads, "SERIAL_WIDTH", 0)  # every pass as torch runs it
    parallel = steps_and_block(model, SEQ, 9, 6)
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel))
    monkeypatch.undo()

    def fail(*args):
        raise RuntimeError("a layer failed")

    hook = model.hf_model.model.layers[0].register_forward_hook(fail)
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="a layer failed"):
        steps_and_block(model, SEQ, 9, 2)
    assert torch.get_num_threads() == 2 and threads.kernel_threads() is None
    hook.remove()


def test_spinning_threads_keep_torchs_threading(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    torch.set_num_threads(2)
    model = int8_tiny("qwen2")
    seen = []
    model.hf_model.model.norm.register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
    steps_and_block(model, SEQ, 9, 2)
    assert seen and set(seen) == {2}

@pytest.mark.parametrize("engine", ["dynamic", "static"])
def test_row_attention_is_the_models_attention(engine):
    """The rows computed one by one equal transformers' SDPA attention over the block (to float rounding),
    also past a sliding window; without a mask (the dynamic engine: keys sliced) and with one (the static
    engine's position-indexed buffers)."""
    for kind in ("qwen2", "gemma3"):
        model = int8_tiny(kind)
        _, rows = steps_and_block(model, SEQ, 17, 6, engine)
        stock = copy.copy(model)  # the same module, its attention left as transformers' SDPA
        stock.block_invariant = False
        model.hf_model.set_attn_implementation("sdpa")
        _, sdpa = steps_and_block(stock, SEQ, 17, 6, engine)
        assert model.hf_model.config._attn_implementation == "sdpa"
        model.configure("dynamic")
        assert model.hf_model.config._attn_implementation == "specdec_rows"
        assert torch.allclose(rows, sdpa, atol=1e-5)


def test_int8_prefill_and_padded_batches_follow_the_models_masks():
    """The prefill (the usual causal kernel, with the sliding window where the prompt is longer) and a
    left-padded batch through transformers' generate (the mask path) equal transformers' SDPA attention."""
    for kind in ("qwen2", "gemma3"):
        model = int8_tiny(kind)
        ids = torch.tensor([SEQ[:20], [3] * 5 + SEQ[:15]])  # the second row left-padded
        mask = torch.ones_like(ids)
        mask[1, :5] = 0
        with torch.inference_mode():
            rows = model.hf_model(input_ids=ids, attention_mask=mask).logits
            model.hf_model.set_attn_implementation("sdpa")
            sdpa = model.hf_model(input_ids=ids, attention_mask=mask).logits
        model.configure("dynamic")
        assert torch.allclose(rows[0], sdpa[0], atol=1e-5) and torch.allclose(rows[1, 5:], sdpa[1, 5:], atol=1e-5)


def test_int8_target_beam_search_exact_speculative_equals_plain():
    """Beam search runs its batch of rows through the masked path: exact speculative beam search with an
    int8 target equals its plain beam search."""
    base = load_tiny("qwen2", eos=None, hidden=128)
    target = quantized_copy(base)
    plain = specdec.generate(target, PROMPT, num_beams=3, max_new_tokens=16)
    spec = specdec.generate(target, PROMPT, draft=perturbed(base, 0.05), num_beams=3, draft_beams=4, gamma=3,
                            max_new_tokens=16)
    assert spec.token_ids == plain.token_ids and spec.stats.exact


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
def test_int8_layer_is_close_to_the_float_layer_and_row_independent(kernel):
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 80, generator=g) * 0.05, torch.randn(96, generator=g)
    layer = Int8Linear.from_float(weight, bias)
    x = torch.randn(37, 80, generator=g) * torch.rand(37, 1, generator=g) * 4
    x[5] = 0.0  # an all-zero row stays finite
    y = layer(x)
    reference = x @ weight.T + bias
    assert torch.isfinite(y).all() and torch.equal(y[5], bias)
    assert (y - reference).norm() / reference.norm() < 0.02
    for i in range(0, 37, 6):
        assert torch.equal(layer(x[i: i + 1]), y[i: i + 1])
    assert torch.equal(layer(x.view(1, 37, 80))[0], y)  # any leading shape
    # the packed weight gives back the quantized weight it was made from, ints and scales
    qweight = torch.quantize_per_channel(weight, layer.weight().q_per_channel_scales(),
                                         torch.zeros(96, dtype=torch.long), 0, torch.qint8)
    assert torch.equal(layer.weight().int_repr(), qweight.int_repr())
    assert torch.equal(layer.weight().q_per_channel_scales(), qweight.q_per_channel_scales())


def test_onednn_rows_are_the_exact_integer_product():
    """The oneDNN kernel on rows quantized to round(127 x / max|x|): the int32 product, scaled per element."""
    if "onednn" not in KERNELS:
        pytest.skip("this torch build has no oneDNN int8 kernel")
    g = torch.Generator().manual_seed(1)
    qweight = _int8_weight(64, 200, seed=1)
    packed = int8_matmul.OnednnWeight(qweight)
    x = torch.randn(5, 200, generator=g)
    scale = x.abs().amax(dim=1, keepdim=True)
    xq = torch.round(x * (127.0 / scale))
    acc = (xq.long() @ qweight.int_repr().long().T).float()  # exact in float32 here (|acc| < 2^24)
    expected = acc * (qweight.q_per_channel_scales().float() / 127) * scale
    assert torch.allclose(packed.rows(x), expected, rtol=1e-6, atol=0)
    assert torch.equal(packed.qweight().int_repr(), qweight.int_repr())


def test_the_kernel_is_chosen_once_and_checked(monkeypatch):
    before = int8_matmul._chosen
    try:
        monkeypatch.setenv(int8_matmul.ENV, "cublas")
        int8_matmul._chosen = None
        with pytest.raises(specdec.SpecDecError, match="unknown int8 kernel 'cublas' .*use one of: specdec, onednn, fbgemm"):
            int8_matmul.chosen()
        monkeypatch.setenv(int8_matmul.ENV, KERNELS[-1])
        int8_matmul._chosen = None
        assert int8_matmul.chosen() == KERNELS[-1]
        monkeypatch.setenv(int8_matmul.ENV, KERNELS[0])  # read once: a later change does not switch it
        assert int8_matmul.chosen() == KERNELS[-1]
        if "specdec" in int8_matmul.available():  # the kernel's name before 2026-12-02 still chooses it
            monkeypatch.setenv(int8_matmul.ENV, "vnni")
            int8_matmul._chosen = None
            assert int8_matmul.chosen() == "specdec"
        monkeypatch.delenv(int8_matmul.ENV)
        int8_matmul._chosen = None
        assert int8_matmul.chosen() == int8_matmul.default_kernel()
    finally:
        int8_matmul._chosen = before


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
@pytest.mark.parametrize("draft", ["prompt-lookup", "perturbed", "hierarchy"])
def test_int8_target_speculative_equals_its_plain_decoding(draft, kernel):
    base = load_tiny("qwen2", eos=None, hidden=128)
    target = quantized_copy(base)
    drafts = {"prompt-lookup": "prompt-lookup", "perturbed": quantized_copy(perturbed(base, 0.05)),
              "hierarchy": [perturbed(base, 0.05), "prompt-lookup"]}
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    for gamma in (2, 4, 8):
        out = specdec.generate(target, PROMPT, draft=drafts[draft], gamma=gamma, max_new_tokens=40)
        assert out.token_ids == plain.token_ids
        assert out.stats.exact and out.stats.not_exact_reason in (None, "")
    assert out.stats.accepted > 0


def test_int8_target_keeps_its_distribution():
    """T = 1 with an int8 target and rounds of two drafted tokens: the joint law of two tokens is the
    int8 target's own (computed exactly from its one-token steps)."""
    target = quantized_copy(load_tiny(vocab=V, eos=None, sharp=2.0))
    draft = perturbed(load_tiny(vocab=V, eos=None, sharp=2.0), 0.7, seed=3)
    probs = exact_joint(target, SamplingParams(temperature=1.0))
    counts = sampled_joint(target, draft, 2000, gamma=2, temperature=1.0)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_unknown_quantization():
    with pytest.raises(specdec.SpecDecError, match="unknown quantization 'int3'; use one of: int8, int8-tensor, int4"):
        quantized_copy(load_tiny(), "int3")


def test_a_loaded_model_is_not_quantized_silently():
    model = load_tiny()
    with pytest.raises(specdec.SpecDecError, match=r"tiny-llama is already loaded \(quantization: None\); to "
                       r"quantize it, load its weights: specdec.load\(model.hf_model"):
        specdec.load(model, quantize="int8")


def _int8_weight(out_features=48, in_features=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out_features, in_features, generator=g)
    scales = w.abs().amax(dim=1) / 127
    return torch.quantize_per_channel(w, scales, torch.zeros(out_features, dtype=torch.long), 0, torch.qint8)


def test_background_packed_linear_waits_for_its_packing():
    """A preset's int8 layer packs its weight on a thread (specdec.models.quantized.quantize); its first use waits."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    qweight, bias = _int8_weight(), torch.randn(48)
    reference = Int8Linear.from_qweight(qweight, bias)
    gate = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(gate.wait)  # the packing queues behind this job: not packed until the gate opens
        layer = Int8Linear.from_qweight(qweight, bias, pool)
        assert not layer._packing.done()
        threading.Timer(0.2, gate.set).start()
        x = torch.randn(3, 32)
        assert torch.equal(layer(x), reference(x))  # forward waited for the packing
        assert layer._packing is None
        assert torch.equal(layer.weight().int_repr(), qweight.int_repr()) and torch.equal(layer.bias, bias)
        # the weight and copies wait too
        gate.clear()
        pool.submit(gate.wait)
        other = Int8Linear.from_qweight(qweight, bias, pool)
        threading.Timer(0.2, gate.set).start()
        assert torch.equal(other.weight().int_repr(), qweight.int_repr())
    assert torch.equal(copy.deepcopy(layer)(x), reference(x))


def test_background_packing_error_is_raised_at_first_use():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        layer = Int8Linear.from_qweight(torch.randn(4, 4), None, pool)  # not a quantized tensor: packing fails
        with pytest.raises(specdec.SpecDecError, match="Int8Linear takes a qint8 weight, got torch.float32"):
            layer(torch.randn(1, 4))


@pytest.mark.parametrize("kernel", KERNELS, indirect=True)
def test_an_int8_pass_outside_inference_mode_after_one_inside(kernel):
    """The row workspace is shared by layers of one width across models; one made under inference mode (a
    generation) must not be written by a pass under no_grad (it failed with 'Inplace update to inference tensor')."""
    model = int8_tiny("llama")
    ids = torch.tensor([[1, 10, 11, 12]])
    with torch.inference_mode():
        inside = model.hf_model(input_ids=ids).logits
    with torch.no_grad():
        outside = model.hf_model(input_ids=ids).logits
    assert torch.equal(inside, outside)




def test_the_quantized_tensor_deprecation_is_silenced_for_every_thread_by_its_text():
    """The loader makes qint8 weights on its packing threads, where a per-call ``warnings.catch_warnings`` raced;
    torch 2.13's deprecation text is filtered process-wide instead, and only that text. (In a new interpreter, as a
    user's process: pytest restores its filters after collection, where the module is imported.)"""
    import subprocess
    import sys

    code = ("import warnings, threading, torch\n"
            "import specdec.models.quantized.int8_weights\n"
            "text = ('torch.quantize_per_tensor, torch.quantize_per_channel and other quantized tensor creation '\n"
            "        'functions that produce tensors with dtype torch.quint8 are deprecated')\n"
            "t = threading.Thread(target=lambda: warnings.warn(text, UserWarning)); t.start(); t.join()\n"
            "warnings.warn('torch.quantize_per_channel: another warning', UserWarning)\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "another warning" in err
    assert "are deprecated" not in err
