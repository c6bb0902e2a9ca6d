"""The preallocated KV cache: in-place writes, rollback by length, checked against transformers' DynamicLayer."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from specdec.models.cache.kv_cache import MIN_CAPACITY, PreallocatedLayer, preallocated_cache
from tiny import load_tiny, tiny_gemma3


def random_states(n, g):
    return torch.randn(1, 2, n, 8, generator=g), torch.randn(1, 2, n, 8, generator=g)  # [B, H_kv, n, D]


def test_updates_and_crops_match_dynamic_layer():
    """A seeded random mix of prefill, multi-token extensions and rollbacks, past the initial capacity:
    the preallocated layer returns exactly what DynamicLayer (torch.cat, the reference) returns."""
    g = torch.Generator().manual_seed(0)
    fast, slow = PreallocatedLayer(), DynamicLayer()
    for step in range(120):
        n = int(torch.randint(1, 9, (1,), generator=g)) if step else 200  # a 200-token prefill first
        k, v = random_states(n, g)
        got, want = fast.update(k, v), slow.update(k, v)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        drop = int(torch.randint(0, n + 1, (1,), generator=g))
        fast.crop(-drop)
        slow.crop(-drop)
        assert fast.get_seq_length() == slow.get_seq_length()
    assert fast.get_seq_length() > MIN_CAPACITY  # the buffers grew at least once


def test_no_reallocation_within_capacity_and_growth_keeps_the_past():
    g = torch.Generator().manual_seed(1)
    layer = PreallocatedLayer()
    k0, v0 = random_states(10, g)
    layer.update(k0, v0)
    buffer = layer._key_buffer.data_ptr()
    for _ in range(50):  # 50 steps of 4 drafted tokens, 2 rejected each time: still within MIN_CAPACITY
        layer.update(*random_states(4, g))
        layer.crop(-2)
        assert layer._key_buffer.data_ptr() == buffer  # written in place, not re-allocated
    assert layer.get_seq_length() == 10 + 50 * 2
    layer.update(*random_states(MIN_CAPACITY, g))  # past the capacity: one re-allocation
    assert layer._key_buffer.data_ptr() != buffer
    assert torch.equal(layer.keys[..., :10, :], k0) and torch.equal(layer.values[..., :10, :], v0)


def test_crop_takes_a_negative_count():
    layer = PreallocatedLayer()
    layer.update(*random_states(3, torch.Generator().manual_seed(2)))
    with pytest.raises(ValueError, match="negative number of tokens"):
        layer.crop(2)


@pytest.mark.parametrize("make", [lambda: load_tiny("qwen2"), lambda: tiny_gemma3(sliding_window=6)],
                         ids=["qwen2", "gemma3-sliding"])
def test_sessions_use_it_and_rollback_gives_fresh_logits(make):
    """Every attention layer is preallocated, sliding-window ones too (the window is in the mask), and
    logits after a rollback and re-extension equal those of a session that never saw the rejected tokens."""
    model = make()
    session, seq = model.start([1, 10, 11, 12, 13, 14, 15, 16, 17])
    assert {type(layer).__name__ for layer in session.cache.layers} == {"PreallocatedLayer"}
    session.logits_of(seq + [20, 21, 22, 23, 24], 6)  # 5 drafted tokens
    rolled = session.logits_of(seq + [20, 21, 30, 31], 3)  # 2 accepted, then a different continuation
    fresh, _ = model.start(seq)
    expected = fresh.logits_of(seq + [20, 21, 30, 31], 3)
    torch.testing.assert_close(rolled, expected, rtol=1e-5, atol=1e-5)


def test_cache_for_a_config_without_layer_types():
    cache = preallocated_cache(load_tiny("llama").hf_model.config)
    assert len(cache.layers) == 2 and all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
