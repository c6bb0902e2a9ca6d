"""Exactness at the shapes the real models run, fast: tiny models with the 0.5B's attention (head dimension 64, 14
query heads on 2 key/value heads) and the 1.5B's (128, 12 on 2), in int8, int4 and int4-mixed (the CPU default:
a GGUF's Q4_K tensors in int4, the rest int8, through specdec's own model as a stored preset loads). Their row
attention takes the grouped path (the tiny models elsewhere have head dimension 16 or 32: the one-row path).

Blocks against steps, bit for bit, on every code path this machine has (AVX-512 VNNI, its AVX2 code, AMX tiles on
or off where present), with 1 and 2 threads; the AVX2 and AVX-512 code give the same bits; and the attention agrees
with SDPA (a planted change in the grouped path that keeps rows independent fails that one)."""

from __future__ import annotations

import contextlib
import functools

import numpy as np
import pytest
import torch

from specdec.models.native import decoder_step

from specdec.models.kernels import extension

from specdec.models.native import row_attention
from test_quantize import SEQ, quantized_copy, steps_and_block
from tiny import tiny_model, tiny_tokenizer

pytestmark = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU runs no specdec kernel")

#: (head dimension, query heads, key/value heads): the 0.5B's and the 1.5B's attention.
SHAPES = {"0.5b": (64, 14, 2), "1.5b": (128, 12, 2)}
METHODS = ("int8", "int4", "int4-mixed")
CASES = ((9, 5), (1, 3), (20, 8), (3, 16))  # (prefix, block): a block after a rolled-back detour, k one-token steps


def code_paths() -> list[str]:
    """The kernel code this machine can run: its AVX-512 code (with and without AMX tiles where it has them) and
    the AVX2 code (which every AVX-512 VNNI CPU runs too)."""
    if extension.kernel_isa() != "avx512":
        return ["avx2"]
    return ["avx512", "avx2"] + (["avx512-no-tiles"] if extension.has_amx() else [])


@contextlib.contextmanager
def code(path: str, monkeypatch) -> None:
    monkeypatch.setenv("SPECDEC_INT8_AMX_FROM", "0" if path == "avx512-no-tiles" else str(extension.AMX_FROM))
    with extension.avx2_code(path == "avx2"):
        yield


def _hf(shape: str):
    head_dim, heads, kv_heads = SHAPES[shape]
    return tiny_model("qwen2", hidden=256, heads=heads, kv_heads=kv_heads, head_dim=head_dim, eos=None, seed=7)


def _mixed(shape: str, folder):
    """The int4-mixed model as a preset's stored variant loads (specdec's own model): a GGUF whose layers with
    256-multiple inputs are Q4_K (the float weights set to their values) and the rest Q8_0 (int8 in the model)."""
    import gguf

    from specdec.models.quantized.int4 import int4_weights
    from specdec.models.formats.stored import save_quantized
    from test_native_model import loaded

    hf = _hf(shape)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    writer = gguf.GGUFWriter(folder / "m.gguf", "qwen2")
    writer.add_block_count(len(hf.model.layers))
    rng = np.random.default_rng(0)
    for i, layer in enumerate(hf.model.layers):
        for attr, short in names.items():
            module = layer.get_submodule(attr)
            out, cols = module.weight.shape
            if cols % 256 == 0 and short != "attn_v":
                blocks = rng.integers(0, 256, size=(out, cols // 256, 144), dtype=np.uint8)
                for at in (0, 2):  # small positive float16 d and dmin
                    blocks[:, :, at:at + 2] = rng.uniform(2e-4, 2e-3, size=(out, cols // 256)).astype(
                        np.float16)[..., None].view(np.uint8)
                raw, kind = blocks.reshape(out, -1), gguf.GGMLQuantizationType.Q4_K
            else:
                kind = gguf.GGMLQuantizationType.Q8_0
                raw = gguf.quantize(module.weight.detach().numpy(), kind)
            writer.add_tensor(f"blk.{i}.{short}.weight", raw, raw_dtype=kind)
            with torch.no_grad():
                module.weight.copy_(torch.from_numpy(gguf.dequantize(raw, kind).reshape(out, cols).astype(np.float32)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    hf.save_pretrained(folder)
    path = folder / "model.int4-mixed.safetensors"
    weights = int4_weights(hf, True, folder / "m.gguf", mixed=True)
    kinds = {type(w).__name__ for w, _ in weights.values()}
    assert kinds == {"Int4Weight", "Tensor"}, kinds  # both halves of the mix
    save_quantized(hf, path, "int4-mixed", weights=weights)
    return loaded(folder, path, "int4-mixed", own=True)


@functools.lru_cache(maxsize=None)
def model(shape: str, method: str):
    if method == "int4-mixed":
        import tempfile
        from pathlib import Path

        return _mixed(shape, Path(tempfile.mkdtemp(prefix="specdec-mixed-")))
    from specdec import load

    base = load(_hf(shape), tokenizer=tiny_tokenizer(), name=f"tiny-{shape}")
    return quantized_copy(base, method)


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("path", code_paths())
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_blocks_equal_steps_at_the_real_shapes(shape, method, path, n_threads, monkeypatch):
    m = model(shape, method)
    assert m.hf_model.config.head_dim == SHAPES[shape][0] and decoder_step.decoder_step(m.hf_model) is not None
    before = torch.get_num_threads()
    torch.set_num_threads(n_threads)
    try:
        with code(path, monkeypatch):
            for prefix, k in CASES:
                steps, block = steps_and_block(m, SEQ, prefix, k)
                assert torch.equal(steps, block), (prefix, k)
    finally:
        torch.set_num_threads(before)


def _logits(m) -> torch.Tensor:
    steps, block = steps_and_block(m, SEQ, 9, 8)
    return torch.cat([steps, block])


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_avx2_code_gives_the_avx512_codes_bits_at_the_real_shapes(shape, method, monkeypatch):
    if extension.kernel_isa() != "avx512":
        pytest.skip("this CPU runs the AVX2 code only")
    m = model(shape, method)
    ext = extension.loaded()
    with code("avx512", monkeypatch):
        wide = _logits(m)
    with code("avx2", monkeypatch):
        calls = ext.avx2_calls()
        narrow = _logits(m)
        assert ext.avx2_calls() > calls  # the AVX2 code really ran
    assert torch.equal(wide, narrow)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_grouped_row_attention_agrees_with_sdpa(shape, monkeypatch):
    """The kernel's attention against SDPA's per row (the same model, its attention alone switched; not the same
    bits: SDPA sums in another order), on each code path. The decoder step (whose attention is the kernel's) is off
    for both."""
    m = model(shape, "int8")
    calls, rows = [0], row_attention._rows

    def counted(*args, **kwargs):
        calls[0] += 1
        return rows(*args, **kwargs)

    monkeypatch.setattr(row_attention, "_rows", counted)
    decoder_step.set_enabled(m.hf_model, False)
    try:
        for path in code_paths():
            with code(path, monkeypatch):
                ours = _logits(m)
                assert calls[0] > 0
                with monkeypatch.context() as sdpa:
                    sdpa.setattr(row_attention, "_kernel", lambda module, query: None)
                    calls[0] = 0
                    theirs = _logits(m)
                    assert calls[0] == 0
            assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), (path, (ours - theirs).abs().max())
    finally:
        decoder_step.set_enabled(m.hf_model, True)
