"""The AVX2 code of specdec's kernels (csrc/gemm_avx2.cpp, for CPUs without AVX-512 VNNI) gives the AVX-512 code's
bits: the int8 and int4 GEMMs (row quantization, exact integer sums, the float epilogue), the row attention and a
whole model's logits through the decoder step. Both paths run on a CPU with AVX-512 VNNI, which this needs."""

from __future__ import annotations

import pytest
import torch

from specdec.models.kernels import extension
from specdec.models.quantized import int8_packed
from specdec.models.quantized.int4 import Int4Weight
from specdec.models.quantized.int8_weights import quantize_weight

pytestmark = pytest.mark.skipif(extension.kernel_isa() != "avx512",
                                reason="comparing both paths needs a CPU with AVX-512 VNNI")


@pytest.fixture
def both():
    """Run ``fn`` on the AVX-512 code, then on the AVX2 code; the process's choice is restored after each."""

    def run(fn):
        out = []
        for avx2 in (False, True):
            with extension.avx2_code(avx2) as ext:
                calls = ext.avx2_calls()
                out.append(fn())
                assert (ext.avx2_calls() > calls) == avx2  # the AVX2 code ran, and only when asked
        return out

    return run


@pytest.mark.parametrize("n,k", [(96, 256), (100, 300), (64, 1536), (40, 8)])
def test_the_gemms_give_the_avx512_bits(both, n, k):
    torch.manual_seed(n + k)
    weight, bias = torch.randn(n, k), torch.randn(n)
    int4, int8 = Int4Weight.quantize(weight), int8_packed.PackedInt8Weight(quantize_weight(weight, True))
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 13, 14):  # (the AVX2 int4 code: up to 8 rows in one call, then 6 + 7, 6 + 8)
        x = torch.randn(m, k) * 3
        x[0, :7] = 0.0  # zeros and a row's largest value among them
        avx512, avx2 = both(lambda: [int4.rows(x, bias=bias), int8.rows(x, bias=bias), int8.rows(x, per_pass=True),
                                     int8.row_parts(x, [32, n - 32])[1] if n > 32 else int8.rows(x)])
        for a, b in zip(avx512, avx2):
            assert torch.equal(a, b), (m, (a - b).abs().max().item())
    # and the values are right: the int4 rows against the dequantized weight in float64
    reference = x.double() @ int4.dequantized().double().T + bias.double()
    torch.testing.assert_close(avx2[0].double(), reference, atol=0.05 * reference.abs().max().item(), rtol=0)


@pytest.mark.parametrize("b,h,h_kv,q,length,d", [(1, 14, 2, 5, 37, 64), (2, 4, 2, 3, 17, 20), (1, 8, 8, 1, 300, 128),
                                                   (2, 12, 2, 5, 70, 128), (1, 16, 2, 4, 50, 256), (1, 6, 2, 8, 333, 32)])
def test_the_row_attention_gives_the_avx512_bits(both, b, h, h_kv, q, length, d):
    """The AVX2 code takes each (row, head) alone; the AVX-512 code takes a key/value head's rows and heads together
    where D is 64, 128 or 256 (keys in blocks, 16 scores summed at once): the same bits either way, whatever the
    rows' spans (a start past 0, an empty span)."""
    torch.manual_seed(length)
    query, key, value = torch.randn(b, h, q, d), torch.randn(b, h_kv, length, d), torch.randn(b, h_kv, length, d)
    starts, ends = torch.zeros(b, q, dtype=torch.long), torch.randint(1, length + 1, (b, q))
    starts[-1, 0], starts[0, -1] = min(5, int(ends[-1, 0])), int(ends[0, -1])  # a span from 5; an empty one
    ext = extension.loaded()
    threads = torch.get_num_threads()
    try:
        for mask in (None, torch.rand(b, q, length) > 0.3, torch.randn(b, q, length)):
            avx512, avx2 = both(lambda: ext.row_attention(query, key, value, starts, ends, mask, d ** -0.5))
            assert torch.equal(avx512, avx2)
            # a key/value head's rows and heads split among more threads (chunks of pairs): the same bits
            torch.set_num_threads(4)
            assert all(torch.equal(a, b) for a, b in zip(
                both(lambda: ext.row_attention(query, key, value, starts, ends, mask, d ** -0.5)), (avx512, avx2)))
            torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_a_model_gives_the_same_logits_on_both_paths(both, method):
    from test_lean_attention import passes
    from test_quantize import quantized_copy
    from tiny import load_tiny

    model = quantized_copy(load_tiny("qwen2", eos=None, hidden=128), method)
    avx512, avx2 = both(lambda: passes(model))  # prefills, steps and blocks (the decoder step), both engines
    assert torch.equal(avx512, avx2)


def test_the_process_runs_the_avx2_code_where_asked(monkeypatch):
    """``ATEN_CPU_CAPABILITY=avx2`` (issue 39's approximation of an AVX2-only CPU) picks the AVX2 code; the extension
    applies the choice when it loads (once per process)."""
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert extension.kernel_isa() == "avx2"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert extension.kernel_isa() == "avx512" and not extension.loaded().uses_avx2()


def test_the_row_attention_of_empty_and_long_passes(both):
    """No rows, or no batch, give an empty output (not a crash); a long pass (a masked prefill: 100 rows of 12 heads
    over 2 key/value heads) is split into many chunks of pairs, with the same bits on both paths and each row's bits
    alone."""
    ext = extension.loaded()
    for b, q in ((1, 0), (0, 3)):
        out = ext.row_attention(torch.zeros(b, 8, q, 64), torch.zeros(b, 2, 5, 64), torch.zeros(b, 2, 5, 64),
                                torch.zeros(b, q, dtype=torch.long), torch.zeros(b, q, dtype=torch.long), None, 0.125)
        assert out.shape == (b, q, 8, 64)
    torch.manual_seed(0)
    q, length, d = 100, 130, 128
    query, key, value = torch.randn(1, 12, q, d), torch.randn(1, 2, length, d), torch.randn(1, 2, length, d)
    ends = torch.arange(length - q + 1, length + 1)[None]
    starts, mask = torch.zeros_like(ends), torch.rand(1, q, length) > 0.2
    avx512, avx2 = both(lambda: ext.row_attention(query, key, value, starts, ends, mask, d ** -0.5))
    assert torch.equal(avx512, avx2)
    for i in (0, 57, 99):
        alone = ext.row_attention(query[:, :, i:i + 1], key, value, starts[:, i:i + 1], ends[:, i:i + 1],
                                  mask[:, i:i + 1], d ** -0.5)
        assert torch.equal(alone[0, 0], avx512[0, i])
