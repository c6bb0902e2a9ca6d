"""int4 weights on specdec's extension (specdec.models.quantized.int4): the kernel multiplies by exactly the
dequantized Q4_K-form weight, each row independent of the others (block invariance); a GGUF's Q4_K blocks come in
bit for bit (checked against gguf-py's own dequantization); an int4 model is block-invariant and, as a draft, never
changes the output. Skipped where the CPU has neither AVX-512 VNNI nor AVX2 (int4 is refused there, tested below)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import specdec
from specdec.models.kernels import extension
from specdec.models.quantized.int4 import Int4Linear, Int4Weight
from test_int8_kernel import tiles_against_vpdpbusd
from test_quantize import PROMPT, SEQ, quantized_copy, steps_and_block
from tiny import load_tiny, perturbed, tiny_gemma3

needs_vnni = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU has neither AVX-512 VNNI nor AVX2")


def reference(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """float64: the rows quantized as the kernel quantizes them, times the dequantized weight."""
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(x * ((1.0 / scale) * 127.0))
    y = (q.double() @ weight.dequantized().double().t()) * (scale.double() / 127.0)
    return y + bias.double() if bias is not None else y


@needs_vnni
@pytest.mark.parametrize("n,k", [(70, 33), (96, 256), (40, 300), (1000, 896)])
def test_rows_multiply_by_the_dequantized_weight_and_each_depends_on_its_own_input_only(n, k):
    torch.manual_seed(n + k)
    w = torch.randn(n, k) * torch.logspace(-2, 0, k)  # columns of different ranges
    weight = Int4Weight.quantize(w)
    assert weight.dequantized().shape == (n, k)
    assert float((weight.dequantized() - w).norm() / w.norm()) < 0.15  # 4 bits: close, not equal
    bias = torch.randn(n)
    x = torch.randn(19, k) * torch.logspace(-2, 2, 19).unsqueeze(1)
    for m in (1, 3, 4, 6, 7, 8, 9, 13, 14, 19):  # (the AVX2 code's calls: up to 8 rows in one, 9 = 6 + 3, 19 = 6 + 6 + 7)
        rows = x[:m].contiguous()
        out = weight.rows(rows, bias=bias)
        ref = reference(rows, weight, bias)
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 1e-5
        alone = torch.cat([weight.rows(rows[i:i + 1].contiguous(), bias=bias) for i in range(m)])
        assert torch.equal(out, alone)
    parts = weight.row_parts(x, (32, n - 32), bias=bias)
    assert [p.shape[1] for p in parts] == [32, n - 32] and torch.equal(torch.cat(parts, 1), weight.rows(x, bias=bias))
    with pytest.raises(specdec.SpecDecError, match="no per-pass mode"):
        weight.rows(x, per_pass=True)


@needs_vnni
@pytest.mark.parametrize("n,k", [(96, 256), (40, 1536), (200, 896)])
def test_the_amx_path_gives_the_vnni_paths_bits(n, k, monkeypatch):
    """Where the CPU has AMX, passes of 16 rows or more take each sub-block's int32 sums from tiles: the same exact
    sums folded in the same order, so the AVX-512 path's bits and each row's own bits alone, over one 16-row tile
    block, blocks and a tail of up to 4 rows (on vpdpbusd), a tail of more (a padded block), several blocks, and
    more than one 64-row chunk."""
    if not extension.has_amx():
        pytest.skip("this CPU has no AMX (or Linux does not let the process use it): only the AVX-512 path runs")
    torch.manual_seed(n * k)
    weight, bias = Int4Weight.quantize(torch.randn(n, k) * torch.logspace(-2, 0, k)), torch.randn(n)
    x = torch.randn(130, k) * torch.logspace(-2, 2, 130).unsqueeze(1)
    for m in (16, 17, 20, 21, 33, 64, 65, 130):
        rows = x[:m].contiguous()
        tiles = tiles_against_vpdpbusd(weight, rows, bias, monkeypatch)
        ref = reference(rows, weight, bias)
        assert float((tiles.double() - ref).abs().max() / ref.abs().max()) < 1e-5


def random_q4k(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random Q4_K blocks [rows, cols / 256 * 144] uint8 with small positive float16 d and dmin."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    blocks[:, :, 0:2] = rng.uniform(1e-4, 1e-2, size=(rows, cols // 256)).astype(np.float16)[..., None].view(np.uint8)
    blocks[:, :, 2:4] = rng.uniform(1e-4, 1e-2, size=(rows, cols // 256)).astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


@needs_vnni
@pytest.mark.parametrize("rows", [
    list(range(128)) + [190, 37],  # a cut head: whole groups, then the end-of-sequence ids
    list(range(32, 96)) + list(range(160, 192)),  # whole groups that do not start at 0
    list(range(5, 80)),  # not aligned: every new group laid out again
    [199, 3, 64, 65, 66, 100],  # any order
    list(range(192, 200)),  # the last group, padded
])
def test_selected_rows_are_those_of_a_whole_relayout(rows):
    torch.manual_seed(len(rows))
    weight = Int4Weight.quantize(torch.randn(200, 300))  # 7 groups, the last with 8 real rows
    keep = torch.tensor(rows)
    q, d, dmin, sc, m = weight.parts()
    relaid = extension.loaded().layout4(q[keep], d[keep], dmin[keep], sc[keep], m[keep])  # every row unpacked
    picked = weight.select(keep)
    assert picked.out_features == len(rows) and picked.in_features == 300
    for mine, theirs in zip((picked.packed, picked.dmins, picked.scs), relaid):
        assert torch.equal(mine, theirs)
    assert torch.equal(picked.dequantized(), weight.dequantized()[keep])


@needs_vnni
def test_q4k_blocks_come_in_exactly():
    from gguf import GGMLQuantizationType, dequantize

    rows, cols = 64, 512
    blocks = random_q4k(rows, cols)
    weight = Int4Weight.from_q4k(blocks, rows, cols)
    theirs = torch.from_numpy(dequantize(blocks, GGMLQuantizationType.Q4_K).reshape(rows, cols).astype(np.float32))
    assert torch.equal(weight.dequantized(), theirs)
    broken = blocks.copy()
    broken[:, 4] ^= 1  # one bit of the first sub-block's sc: that sub-block's values change
    assert not torch.equal(Int4Weight.from_q4k(broken, rows, cols).dequantized(), theirs)


@needs_vnni
@pytest.mark.parametrize("kind", ["qwen2", "llama", "gemma3"])
def test_an_int4_model_is_block_invariant(kind):
    model = quantized_copy(tiny_gemma3(eos=None) if kind == "gemma3" else load_tiny(kind, eos=None, hidden=128), "int4")
    assert model.block_invariant and model.name.endswith("+int4")
    assert any(isinstance(m, Int4Linear) for m in model.hf_model.modules())
    for prefix in (3, 9, 17):
        for k in (2, 5, 9):
            steps, block = steps_and_block(model, SEQ, prefix, k)
            assert torch.equal(steps, block), (prefix, k)


@needs_vnni
def test_an_int4_draft_never_changes_the_output():
    target = quantized_copy(load_tiny("qwen2", eos=None, hidden=128))  # the int8 target, as on CPU by default
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    draft = quantized_copy(perturbed(load_tiny("qwen2", eos=None, hidden=128), 0.05), "int4")
    for spec in (draft, [draft, "prompt-lookup"]):
        for gamma in (1, 4):
            out = specdec.generate(target, PROMPT, draft=spec, gamma=gamma, max_new_tokens=40)
            assert out.token_ids == plain.token_ids and out.stats.exact
    assert out.stats.accepted > 0


def test_int4_without_avx512_vnni_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setattr(extension, "cpu_supported", lambda: False)
    with pytest.raises(specdec.SpecDecError, match="int4.*need a CPU with AVX-512 VNNI or AVX2.*use int8"):
        quantized_copy(load_tiny(), "int4")
    monkeypatch.setenv("SPECDEC_KERNELS", "off")
    with pytest.raises(specdec.SpecDecError, match="int4.*SPECDEC_KERNELS=off turns off: unset it, or use int8"):
        quantized_copy(load_tiny(), "int4")


@needs_vnni
def test_a_stored_int4_model_loads_as_it_was_saved(tmp_path, monkeypatch):
    """The preset's int4 file (what the conversion writes: the layers' values and scales as the kernel reads them,
    sibling sets already stacked as they run, the tied table once) loads into a model with the same layers, so the
    same logits, and no packing or stacking; a file with every layer apart (written before sets were stored) loads
    to the same model."""
    import copy
    import json

    from safetensors import safe_open

    from specdec.models.quantized import int4
    from specdec.models.quantized.int4 import int4_weights
    from specdec.models.quantized.int8_fusion import Int8Slice
    from specdec.models.quantized.quantize import quantize_hf
    from specdec.models.formats.stored import load_quantized, save_quantized
    from tiny import tiny_model

    hf = tiny_model(eos=None).float().eval()
    hf.config.tie_word_embeddings = True
    hf.tie_weights()
    hf.save_pretrained(tmp_path)
    reference = copy.deepcopy(hf)
    quantize_hf(reference, "int4")
    path = tmp_path / "model.int4.safetensors"
    save_quantized(hf, path, "int4", weights=int4_weights(hf, free_floats=True))
    loaded = load_quantized(tmp_path, path, "int4")
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.inference_mode():
        assert torch.equal(loaded(ids).logits, reference(ids).logits)
    assert isinstance(loaded.lm_head, Int4Linear)
    attn = loaded.model.layers[0].self_attn
    assert isinstance(attn.k_proj, Int8Slice) and attn.k_proj.fused is attn.q_proj.fused is attn.v_proj.fused
    with safe_open(str(path), framework="pt") as f:
        stored = json.loads(f.metadata()["specdec_quantized_linears"])
        keys = set(f.keys())
    q = "model.layers.0.self_attn.q_proj"
    assert stored[q]["members"] == [q, q.replace("q_", "k_"), q.replace("q_", "v_")] and stored[q]["outs"] == [64, 32, 32]
    assert f"{q}.int4_packed" in keys and not any(k.startswith(q.replace("q_", "k_")) for k in keys)
    with pytest.raises(specdec.SpecDecError, match="holds 'int4' weights, expected 'int8'"):
        load_quantized(tmp_path, path, "int8")

    apart = tmp_path / "apart.int4.safetensors"
    with monkeypatch.context() as m:  # the format of before: one entry per layer
        m.setattr(int4, "int4_sets", lambda w: [([n], [wb[0].out_features], *wb) for n, wb in w.items()])
        hf = tiny_model(eos=None).float().eval()
        hf.config.tie_word_embeddings = True
        hf.tie_weights()
        save_quantized(hf, apart, "int4", weights=int4_weights(hf, free_floats=True))
    with safe_open(str(apart), framework="pt") as f:
        assert f"{q.replace('q_', 'k_')}.int4_packed" in set(f.keys())
    old = load_quantized(tmp_path, apart, "int4")
    with torch.inference_mode():
        assert torch.equal(old(ids).logits, reference(ids).logits)
    assert old.model.layers[0].self_attn.k_proj.fused is old.model.layers[0].self_attn.q_proj.fused


@needs_vnni
@pytest.mark.parametrize("mixed", [True, False])
def test_a_ggufs_q4k_layers_come_in_exactly_and_the_rest_as_the_method_says(tmp_path, mixed):
    """int4-mixed (int4): a layer the GGUF stores as Q4_K whose float weight is its dequantization comes in as those
    blocks; a layer stored with another type, one whose float weight differs from the file's, or one the file lacks
    becomes int8 (is quantized into int4)."""
    import gguf

    from specdec.models.quantized.int4 import int4_weights
    from tiny import tiny_model

    hf = tiny_model("qwen2", hidden=256, eos=None).float().eval()
    layer0, layer1 = hf.model.layers[0], hf.model.layers[1]
    writer = gguf.GGUFWriter(tmp_path / "m.gguf", "qwen2")
    writer.add_block_count(2)
    stored = {"blk.0.attn_q.weight": (layer0.self_attn.q_proj, random_q4k(256, 256, 1), gguf.GGMLQuantizationType.Q4_K),
              "blk.1.ffn_down.weight": (layer1.mlp.down_proj, random_q4k(256, 512, 2), gguf.GGMLQuantizationType.Q4_K),
              "blk.0.attn_v.weight": (layer0.self_attn.v_proj, None, gguf.GGMLQuantizationType.Q8_0)}
    for name, (module, raw, kind) in stored.items():
        if raw is None:
            raw = gguf.quantize(module.weight.detach().numpy(), kind)
        writer.add_tensor(name, raw, raw_dtype=kind)
        values = gguf.dequantize(raw, kind).reshape(module.weight.shape)
        with torch.no_grad():
            module.weight.copy_(torch.from_numpy(values.astype(np.float32)))
    with torch.no_grad():
        layer1.mlp.down_proj.weight[0, 0] += 1.0  # no longer the file's values
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    q_float = layer0.self_attn.q_proj.weight.detach().clone()
    weights = int4_weights(hf, gguf_path=tmp_path / "m.gguf", mixed=mixed)
    exact = weights["model.layers.0.self_attn.q_proj"][0]
    assert isinstance(exact, Int4Weight) and torch.equal(exact.dequantized(), q_float)
    for name in ("model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj", "model.layers.0.mlp.up_proj"):
        weight = weights[name][0]
        assert (isinstance(weight, torch.Tensor) and weight.is_quantized) if mixed else isinstance(weight, Int4Weight)


@needs_vnni
def test_int4_mixed_needs_a_ggufs_tensor_types():
    with pytest.raises(specdec.SpecDecError, match="int4-mixed' follows the tensor types of a preset's GGUF.*use int4 or int8"):
        quantized_copy(load_tiny(), "int4-mixed")


@needs_vnni
def test_the_threads_share_the_groups_without_changing_a_bit():
    """The GEMMs start each thread on an equal share of their column groups, and a thread done with its share takes
    groups from the end of another's (csrc/work_items.h): every group computed once, by whichever thread, so the
    equal split's bits, for the int4 and the int8 kernel, with one thread, two, and more threads than cores (some
    wait for a core while the others take from their shares: the taking path runs)."""
    from specdec.models.quantized import int8_packed
    from specdec.models.quantized.int8_weights import quantize_weight

    torch.manual_seed(5)
    int4 = Int4Weight.quantize(torch.randn(32 * 37 + 5, 512))
    int8 = int8_packed.PackedInt8Weight(quantize_weight(torch.randn(32 * 41, 256), True))
    x4, x8, bias4 = torch.randn(19, 512), torch.randn(19, 256), torch.randn(32 * 37 + 5)
    ext, threads = extension.loaded(), torch.get_num_threads()
    try:
        ext.set_dynamic_split(False)
        equal = [(int4.rows(x4[:m].contiguous(), bias=bias4), int8.rows(x8[:m].contiguous())) for m in (1, 5, 19)]
        ext.set_dynamic_split(True)
        stolen = ext.stolen_groups()
        for n in (1, 2, (os.cpu_count() or 2) + 1):
            torch.set_num_threads(n)
            for _ in range(1 if n < 3 else 20):
                for m, (y4, y8) in zip((1, 5, 19), equal):
                    assert torch.equal(int4.rows(x4[:m].contiguous(), bias=bias4), y4)
                    assert torch.equal(int8.rows(x8[:m].contiguous()), y8)
        assert ext.stolen_groups() > stolen  # (the threads that had a core took groups from the one that waited)
    finally:
        ext.set_dynamic_split(True)
        torch.set_num_threads(threads)
