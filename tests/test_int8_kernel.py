"""specdec's own int8 kernel (specdec.models.kernels.extension, specdec.models.quantized.int8_packed): exact against an integer reference, one row's output
independent of the others (block invariance), the oneDNN path's bits, and the fallback when it cannot run.

The kernel needs a CPU with AVX-512 VNNI or AVX2 (its AVX2 code: tests/test_avx2_kernels.py); elsewhere these tests
are skipped (the int8 models run fbgemm there, and tests/test_quantize.py tests every kernel the machine has)."""

from __future__ import annotations

import warnings

import pytest
import torch

import specdec
from specdec.models.kernels import int8_matmul
from specdec.models.kernels import extension
from specdec.models.quantized import int8_packed
from specdec.models.quantized.int8_weights import quantize_weight

pytestmark = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU has neither AVX-512 VNNI nor AVX2")


def reference(x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, per_pass: bool = False) -> torch.Tensor:
    """The kernel's arithmetic in torch: rows quantized to round(x * (127 / max|x|)), int64 products, elementwise
    scales ((float(acc) * (w_scale / 127)) * row_scale) + bias."""
    tiny = torch.finfo(torch.float32).tiny
    scale = x.abs().amax(dim=1, keepdim=True).clamp_min(tiny)  # [M, 1]
    if per_pass:
        scale = scale.amax().expand_as(scale)
    q = torch.round(x * (127.0 / scale)).long()  # [M, K]
    acc = q @ qweight.int_repr().long().t()  # [M, N], exact
    if qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        w_scale = qweight.q_per_channel_scales().float()
    else:
        w_scale = torch.tensor([qweight.q_scale()], dtype=torch.float32).expand(qweight.shape[0])
    y = (acc.float() * (w_scale.contiguous() / 127.0)) * scale
    return y + bias if bias is not None else y


@pytest.mark.parametrize("n,k,per_channel", [(70, 33, True), (96, 64, True), (37, 130, False), (1000, 300, True)])
def test_rows_are_exact_and_each_depends_on_its_own_input_only(n, k, per_channel):
    torch.manual_seed(n + k)
    qweight = quantize_weight(torch.randn(n, k), per_channel)
    weight = int8_packed.PackedInt8Weight(qweight)
    bias = torch.randn(n)
    x = torch.randn(19, k) * torch.logspace(-2, 2, 19).unsqueeze(1)  # rows of very different ranges
    for m in (1, 3, 8, 9, 19):  # one register block, a full one, a full one and one row, several
        rows = x[:m].contiguous()
        out = weight.rows(rows, bias=bias)
        assert torch.equal(out, reference(rows, qweight, bias))
        alone = torch.cat([weight.rows(rows[i:i + 1].contiguous(), bias=bias) for i in range(m)])
        assert torch.equal(out, alone)
    assert torch.equal(weight.rows(x, bias=None), reference(x, qweight, None))


@pytest.mark.parametrize("n,k", [(96, 64), (70, 192), (40, 1536)])
def test_the_amx_path_gives_the_vnni_paths_bits(n, k, monkeypatch):
    """Where the CPU has AMX, passes of AMX_FROM rows or more run on tiles (K a multiple of 64): the same exact
    int32 sums, so the reference's bits, each row's own bits alone, and the AVX-512 path's bits, over one
    16-row tile block, a full one and one row, and several."""
    if not extension.has_amx():
        pytest.skip("this CPU has no AMX (or Linux does not let the process use it): only the AVX-512 path runs")
    torch.manual_seed(n * k)
    qweight = quantize_weight(torch.randn(n, k), True)
    weight, bias = int8_packed.PackedInt8Weight(qweight), torch.randn(n)
    x = torch.randn(33, k) * torch.logspace(-2, 2, 33).unsqueeze(1)
    for m in (2, 8, 16, 17, 33):
        rows = x[:m].contiguous()
        tiles = tiles_against_vpdpbusd(weight, rows, bias, monkeypatch)
        assert torch.equal(tiles, reference(rows, qweight, bias))


def tiles_against_vpdpbusd(weight, rows: torch.Tensor, bias: torch.Tensor, monkeypatch) -> torch.Tensor:
    """``weight.rows(rows)`` on AMX tiles (``SPECDEC_INT8_AMX_FROM=1``), asserted bit for bit equal to the AVX-512
    path's (``0``) and to each row's own output alone; returns it (for the GEMM's own reference)."""
    monkeypatch.setenv("SPECDEC_INT8_AMX_FROM", "1")
    tiles = weight.rows(rows, bias=bias)
    alone = torch.cat([weight.rows(rows[i:i + 1].contiguous(), bias=bias) for i in range(rows.shape[0])])
    monkeypatch.setenv("SPECDEC_INT8_AMX_FROM", "0")
    assert torch.equal(tiles, weight.rows(rows, bias=bias))
    assert torch.equal(tiles, alone)
    return tiles


def test_a_bad_amx_row_count_is_refused(monkeypatch):
    monkeypatch.setenv("SPECDEC_INT8_AMX_FROM", "eight")
    with pytest.raises(specdec.SpecDecError, match="SPECDEC_INT8_AMX_FROM must be a row count"):
        extension.amx_from()
    monkeypatch.delenv("SPECDEC_INT8_AMX_FROM")
    assert extension.amx_from() == extension.AMX_FROM


def test_per_pass_uses_one_scale_and_is_not_block_invariant():
    torch.manual_seed(1)
    qweight = quantize_weight(torch.randn(64, 48), True)
    weight = int8_packed.PackedInt8Weight(qweight)
    x = torch.randn(4, 48) * torch.tensor([[0.01], [1.0], [10.0], [100.0]])
    out = weight.rows(x, per_pass=True)
    assert torch.equal(out, reference(x, qweight, None, per_pass=True))
    assert not torch.equal(out[:1], weight.rows(x[:1].contiguous(), per_pass=True))  # row 0 alone has its own scale


def test_the_parts_of_a_fused_layer_are_its_columns_written_apart():
    """row_parts (a fused layer's siblings): each part is its columns of the whole output, bit for bit and
    contiguous, for the AVX-512 path and (where the CPU has it) the tiles; a part not starting at a multiple of 32
    columns is refused by name, and the fused model layer falls back to slicing there."""
    torch.manual_seed(4)
    qweight = quantize_weight(torch.randn(32 * 5 + 7, 128), True)
    weight, bias = int8_packed.PackedInt8Weight(qweight), torch.randn(32 * 5 + 7)
    for m in (1, 5, 20):
        x = torch.randn(m, 128)
        whole = weight.rows(x, bias=bias)
        parts = weight.row_parts(x, [64, 32, 71], bias=bias)
        assert [p.shape for p in parts] == [(m, 64), (m, 32), (m, 71)] and all(p.is_contiguous() for p in parts)
        assert torch.equal(torch.cat(parts, dim=1), whole)
    with pytest.raises(RuntimeError, match="parts must start at multiples of 32"):
        weight.row_parts(torch.randn(2, 128), [40, 127])
    with pytest.raises(RuntimeError, match="widths must sum to 167"):
        weight.row_parts(torch.randn(2, 128), [64, 32])
    from specdec.models.quantized.int8_linear import Int8Linear

    layer = Int8Linear.from_qweight(qweight, bias)
    x = torch.randn(3, 128)
    for widths in ([64, 103], [40, 127]):  # written apart, then sliced (40 is no multiple of 32)
        parts = layer.parts(x, widths)
        assert torch.equal(torch.cat(parts, dim=1), layer(x)) and all(p.is_contiguous() for p in parts)


def test_the_packing_gives_the_weight_back():
    torch.manual_seed(2)
    for n, k, per_channel in ((33, 7, True), (64, 64, False)):
        qweight = quantize_weight(torch.randn(n, k), per_channel)
        back = int8_packed.PackedInt8Weight(qweight).qweight()
        assert torch.equal(back.int_repr(), qweight.int_repr())
        assert back.qscheme() == qweight.qscheme()
        ints = qweight.int_repr()
        packed, colsum128 = int8_packed.pack(ints)
        assert packed.shape == (-(-n // 32), -(-k // 4), 32, 4)
        assert torch.equal(int8_packed.unpack(packed, n, k), ints)
        assert torch.equal(colsum128, ints.sum(dim=1, dtype=torch.int32) * 128)
        # the layout spelled out in torch: 32 output columns a group, 4 input columns a lane, zero padding
        padded = torch.nn.functional.pad(ints, (0, -k % 4, 0, -n % 32))  # [N32, K4]
        assert torch.equal(packed, padded.reshape(-(-n // 32), 32, -(-k // 4), 4).permute(0, 2, 1, 3))
        top, rest = ints[: n // 3], ints[n // 3:]  # sibling parts stacked (a fused layer)
        assert all(torch.equal(a, b) for a, b in zip(int8_packed.pack(top, rest), (packed, colsum128)))


@pytest.mark.skipif("onednn" not in int8_matmul.available(), reason="this torch build has no oneDNN int8 kernel")
def test_the_bits_are_the_onednn_paths():
    torch.manual_seed(3)
    qweight = quantize_weight(torch.randn(200, 96), True)
    ours, onednn = int8_packed.PackedInt8Weight(qweight), int8_matmul.OnednnWeight(qweight)
    for m in (1, 5, 12):
        x = torch.randn(m, 96) * 3
        assert torch.equal(ours.rows(x), onednn.rows(x))


def test_onednn_is_offered_only_where_its_int8_sums_are_exact(monkeypatch):
    """oneDNN's int8 GEMM without VNNI or AMX saturates its int16 pair sums (an AVX2-only EPYC: products off by up to
    9%), so on such an x86 CPU it is not an int8 kernel specdec offers, and asking for it says why."""
    from specdec.models.kernels import cpu

    assert not cpu.onednn_int8_exact({"avx2", "fma", "f16c"}, "x86_64")
    assert cpu.onednn_int8_exact({"avx2", "avx512f", "avx512_vnni"}, "x86_64")
    assert cpu.onednn_int8_exact({"avx2", "avx_vnni"}, "x86_64") and cpu.onednn_int8_exact({"amx_int8"}, "x86_64")
    assert cpu.onednn_int8_exact(set(), "aarch64")  # (ARM builds: no fbgemm, oneDNN is the int8 kernel there)
    monkeypatch.setattr(cpu, "onednn_int8_exact", lambda *a: False)
    assert "onednn" not in int8_matmul.available()
    with pytest.raises(specdec.SpecDecError, match="'onednn' is not available in this torch build or on this CPU"):
        int8_matmul.check_kernel("onednn")


def test_asymmetric_weights_are_refused_with_the_fix():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qweight = torch.quantize_per_tensor(torch.randn(8, 8), 0.05, 3, torch.qint8)
    with pytest.raises(specdec.SpecDecError, match="zero points 0.*SPECDEC_INT8_KERNEL=fbgemm"):
        int8_packed.PackedInt8Weight(qweight)


def test_a_kernel_that_cannot_be_built_falls_back_to_fbgemm_and_says_so(monkeypatch):
    if "fbgemm" not in int8_matmul.available():
        pytest.skip("no fbgemm in this torch build")
    before = int8_matmul._chosen
    monkeypatch.delenv(int8_matmul.ENV, raising=False)
    monkeypatch.setattr(int8_matmul, "default_kernel", lambda: "specdec")
    monkeypatch.setattr(extension, "build_error", lambda: "could not build specdec's vnni int8 kernel (no compiler)")
    monkeypatch.setattr(extension, "_warned", False)
    try:
        int8_matmul._chosen = None
        with pytest.warns(UserWarning, match="no compiler.*fbgemm"):
            assert int8_matmul.chosen() == "fbgemm"
        monkeypatch.setenv(int8_matmul.ENV, "specdec")  # asked for by name: an error that names the way out
        int8_matmul._chosen = None
        with pytest.raises(specdec.SpecDecError, match="no compiler.*SPECDEC_INT8_KERNEL=fbgemm"):
            int8_matmul.chosen()
    finally:
        int8_matmul._chosen = before


def test_a_cpu_without_the_preferred_kernel_runs_fbgemm_not_onednn(monkeypatch):
    """The CPU kind says vnni (its flags) but the kernel cannot run (ATEN_CPU_CAPABILITY=default: no AVX2 either):
    fbgemm, not the first kernel listed (oneDNN's int8 GEMM without AMX was 2 s a token)."""
    if "fbgemm" not in int8_matmul.available():
        pytest.skip("no fbgemm in this torch build")
    before = int8_matmul._chosen
    monkeypatch.delenv(int8_matmul.ENV, raising=False)
    monkeypatch.setattr(int8_matmul, "default_kernel", lambda: "specdec")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    try:
        int8_matmul._chosen = None
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an expected hardware limit: no warning
            assert int8_matmul.chosen() == "fbgemm"
    finally:
        int8_matmul._chosen = before


def test_row_attention_gives_each_row_the_bits_it_gets_alone_and_sdpas_values():
    """The extension's attention (the int8 models' with specdec's int8 kernel): a block of query rows, each over the
    keys of its own prefix (a sliding window's last keys for some), equals each row computed alone bit for bit,
    and SDPA's attention to float32 rounding; a mask line (bool or additive) applies per row."""
    ext = extension.loaded()
    torch.manual_seed(4)
    b, h, h_kv, q, length, d = 2, 6, 2, 5, 70, 64
    query, key, value = torch.randn(b, h, q, d), torch.randn(b, h_kv, length, d), torch.randn(b, h_kv, length, d)
    ends = torch.arange(length - q + 1, length + 1).expand(b, q)  # [B, q]
    starts = torch.tensor([[0] * q, [0, 3, 60, 0, 66]])  # row (1, 2) and (1, 4) in a window
    out = ext.row_attention(query, key, value, starts, ends, None, d ** -0.5)  # [B, q, H, D]
    for bi in range(b):
        for i in range(q):
            lo, hi = int(starts[bi, i]), int(ends[bi, i])
            alone = ext.row_attention(query[bi:bi + 1, :, i:i + 1], key[bi:bi + 1, :, lo:hi], value[bi:bi + 1, :, lo:hi],
                                      torch.zeros(1, 1, dtype=torch.long), torch.full((1, 1), hi - lo), None, d ** -0.5)
            assert torch.equal(out[bi, i], alone[0, 0])
            sdpa = torch.nn.functional.scaled_dot_product_attention(
                query[bi:bi + 1, :, i:i + 1].reshape(1, h_kv, h // h_kv, d), key[bi:bi + 1, :, lo:hi],
                value[bi:bi + 1, :, lo:hi]).reshape(h, d)
            torch.testing.assert_close(out[bi, i], sdpa, atol=2e-6, rtol=1e-5)
    full = (torch.zeros(b, q, dtype=torch.long), torch.full((b, q), length))
    keep = torch.rand(b, q, length) > 0.4
    masked = ext.row_attention(query, key, value, *full, keep, d ** -0.5)
    additive = torch.zeros(b, q, length).masked_fill(~keep, float("-inf"))
    assert torch.equal(masked, ext.row_attention(query, key, value, *full, additive, d ** -0.5))
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, h_kv, h // h_kv * q, d).reshape(b, h_kv, h // h_kv, q, d).flatten(2, 3), key, value,
        attn_mask=keep.repeat(1, h // h_kv, 1).unsqueeze(1))
    torch.testing.assert_close(masked, sdpa.reshape(b, h_kv, h // h_kv, q, d).permute(0, 3, 1, 2, 4).reshape(b, q, h, d),
                               atol=2e-6, rtol=1e-5)
    nothing = ext.row_attention(query, key, value, *full, torch.zeros(b, q, length, dtype=torch.bool), d ** -0.5)
    assert torch.equal(nothing, torch.zeros_like(nothing))  # no key to attend to: zeros
    with pytest.raises(RuntimeError, match="float32"):
        ext.row_attention(query.double(), key, value, *full, None, 1.0)


def test_an_int8_model_on_the_vnni_kernel_runs_the_extensions_attention():
    from specdec.models.native.row_attention import KERNEL_ATTRIBUTE
    from test_quantize import int8_tiny

    before = int8_matmul._chosen
    try:
        int8_matmul.use("specdec")
        model = int8_tiny("qwen2")
        assert getattr(model.hf_model.model.layers[0].self_attn, KERNEL_ATTRIBUTE) is extension.loaded()
        if "fbgemm" in int8_matmul.available():
            int8_matmul.use("fbgemm")
            assert getattr(int8_tiny("qwen2").hf_model.model.layers[0].self_attn, KERNEL_ATTRIBUTE) is None
    finally:
        int8_matmul._chosen = before


def test_the_capability_override_picks_the_kernels_code(monkeypatch):
    """``ATEN_CPU_CAPABILITY=avx2`` (how issue 39 approximates an AVX2-only CPU): the kernel's AVX2 code; ``default``
    (no AVX2): no vnni kernel, fbgemm."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert extension.kernel_isa() == "avx2" and extension.cpu_supported()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert extension.kernel_isa() is None and not extension.cpu_supported()
    assert "specdec" not in int8_matmul.available()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    assert extension.kernel_isa() in ("avx512", "avx2")  # (avx2 where the CPU has no AVX-512 VNNI)



@pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU runs no specdec kernel")
def test_the_entry_points_refuse_tensors_of_the_wrong_size():
    """A caller's mistake is a clear error from the extension, not a read past a buffer."""
    ext = extension.loaded()
    torch.manual_seed(0)
    weight = int8_packed.PackedInt8Weight(torch.quantize_per_channel(torch.randn(40, 64), torch.full((40,), 0.02),
                                                             torch.zeros(40, dtype=torch.long), 0, torch.qint8))
    x = torch.randn(3, 64)
    good = (x, weight.packed, weight.colsum128, weight.scales_per_q, None, 40, False, 0, [])
    assert ext.rows(*good)[0].shape == (3, 40)
    cases = [((x, weight.packed, weight.colsum128[:20], weight.scales_per_q, None, 40, False, 0, []), "colsum128"),
             ((x, weight.packed, weight.colsum128, weight.scales_per_q[:8], None, 40, False, 0, []), "scales"),
             ((x, weight.packed, weight.colsum128, weight.scales_per_q, torch.zeros(5), 40, False, 0, []), "bias"),
             ((x, weight.packed, weight.colsum128, weight.scales_per_q, None, 100, False, 0, []),
              "N = 100 output columns; the packed weight holds 64"),
             ((torch.randn(3, 80), weight.packed, weight.colsum128, weight.scales_per_q, None, 40, False, 0, []),
              "x has 80 columns")]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            ext.rows(*args)
