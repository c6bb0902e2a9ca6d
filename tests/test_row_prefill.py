"""A prompt's attention rows do not depend on how the prompt is fed: with specdec's row kernel a prefill's rows are
each computed over their own prefix, so a prompt fed in one pass, in chunks (the batch engine's chunked prefill) or
after a kept prefix (the prefix cache) gives the same bits. At the 1.5B's shapes (12 query heads over 2 key/value
heads, D = 128) and a prompt past torch's SDPA blocks, the causal SDPA kernel the prefill used before did not: the
serving benchmark found batched rows that differed from the same request alone (2026-12-02)."""

from __future__ import annotations

import pytest
import torch

from specdec.models.kernels import extension
from specdec.models.native import row_attention

pytestmark = pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU has neither AVX-512 VNNI nor AVX2")


class Layer(torch.nn.Module):
    sliding_window = None


def attend(layer, query, key, value):  # query [1, H, q, D]; keys [1, H_kv, L, D] with the q new ones last
    return row_attention.row_attention(layer, query, key, value, None, scaling=query.shape[-1] ** -0.5)[0]


@pytest.mark.parametrize("length, chunk", [(300, 128), (218, 128), (97, 40)])
def test_a_prefill_in_chunks_gives_the_one_pass_bits(length, chunk):
    g = torch.Generator().manual_seed(length)
    heads, kv_heads, dim = 12, 2, 128
    query = torch.randn(1, heads, length, dim, generator=g)
    key, value = (torch.randn(1, kv_heads, length, dim, generator=g) for _ in range(2))
    layer = Layer()
    setattr(layer, row_attention.KERNEL_ATTRIBUTE, extension.loaded())
    whole = attend(layer, query, key, value)  # [1, L, H, D]
    parts = [attend(layer, query[:, :, s:s + chunk], key[:, :, :s + chunk], value[:, :, :s + chunk])
             for s in range(0, length, chunk)]
    assert torch.equal(whole, torch.cat(parts, dim=1))
    # the same in a ragged batch pass (BatchSession): a prefill beside a continuation of the same prompt
    spans = [(0, length), (chunk, length - chunk)]
    width = length
    q = torch.zeros(2, heads, width, dim)
    q[0], q[1, :, :length - chunk] = query[0], query[0, :, chunk:]
    k, v = key.expand(2, -1, -1, -1).contiguous(), value.expand(2, -1, -1, -1).contiguous()
    with row_attention.exact_rows(spans):
        batch = attend(layer, q, k, v)  # [2, w, H, D]
    assert torch.equal(batch[0], whole[0]) and torch.equal(batch[1, :length - chunk], whole[0, chunk:])
