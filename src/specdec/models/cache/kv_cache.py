"""A KV cache written in place: no re-allocation per forward pass, rollback by moving a length.

transformers' ``DynamicLayer`` grows by ``torch.cat``: every forward pass allocates a new tensor per
layer and copies the whole cache into it (a 1.5B model at 300 tokens copies about 9 MB per pass). A
:class:`PreallocatedLayer` instead keeps one buffer per layer for keys and one for values, writes the
new positions into it, and hands attention a view of the filled part. The buffer grows by doubling,
so a generation of n tokens re-allocates O(log n) times instead of once per forward pass.

Rollback is position bookkeeping (as in gpt-fast): ``crop`` only shortens the filled length; the
rejected positions stay in the buffer and are overwritten by the next forward pass.

Every layer is replaced, sliding-window layers (Gemma 3) too: they keep every position, and the
window lives in the mask that transformers builds from the model's config (as for a cache without
per-layer types), so a rollback across the window needs nothing special. The cost: past the window
(512 positions for Gemma 3 270M) those layers attend over every position. transformers' own sliding
layer needs "past recording" for such a rollback, and in 5.17 (the GPU machines' version; fixed by
5.24) that mode handed attention more positions than its mask covered: a shape error on the first
step past the window.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

MIN_CAPACITY = 256  # positions allocated at least, so short generations never re-allocate


class PreallocatedLayer(DynamicLayer):
    """One layer's keys and values in buffers [batch, kv_heads, capacity, head_dim], filled up to ``length``.

    ``keys`` / ``values`` (what transformers reads) are views [batch, kv_heads, length, head_dim] of the
    buffers, so ``get_seq_length``, masks and attention see only the filled part.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self._key_buffer = self._value_buffer = None

    def _reserve(self, end: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Make the buffers hold at least ``end`` positions, keeping the filled part."""
        if self._key_buffer is not None and end <= self._key_buffer.shape[-2]:
            return
        capacity = max(MIN_CAPACITY, 2 * end)
        new_buffers = []
        for old, states in ((self._key_buffer, key_states), (self._value_buffer, value_states)):
            batch, heads, _, dim = states.shape
            buf = states.new_empty(batch, heads, capacity, dim)  # [B, H_kv, capacity, D]
            if old is not None and self.length:
                buf[..., : self.length, :].copy_(old[..., : self.length, :])
            new_buffers.append(buf)
        self._key_buffer, self._value_buffer = new_buffers

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions (key_states, value_states: [B, H_kv, new, D]) after the filled part."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        self._key_buffer[..., self.length : end, :].copy_(key_states)
        self._value_buffer[..., self.length : end, :].copy_(value_states)
        self.filled(end)
        return self.keys, self.values

    def reserve(self, end: int) -> None:
        """Make the buffers of an initialized layer hold at least ``end`` positions (for a writer of its own:
        specdec.models.native.decoder_step), keeping the filled part."""
        self._reserve(end, self.keys, self.values)

    def filled(self, end: int) -> None:
        """The buffers now hold ``end`` positions (written by :meth:`update` or directly)."""
        self.length = end
        self.keys = self._key_buffer[..., :end, :]  # [B, H_kv, end, D], a view
        self.values = self._value_buffer[..., :end, :]

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last ``-tokens_to_remove`` positions (a negative count, as ``DynamicLayer.crop``)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self.length = max(0, self.length - abs(tokens_to_remove))
        self.keys = self._key_buffer[..., : self.length, :]
        self.values = self._value_buffer[..., : self.length, :]

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self.length = 0
        super().reset()

    def _unsupported(self, *args, **kwargs) -> None:
        raise NotImplementedError("a specdec KV session holds one sequence; batch and beam operations use DynamicCache")

    batch_repeat_interleave = batch_select_indices = reorder_cache = _unsupported


def preallocated_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose attention layers (full and sliding-window) are
    :class:`PreallocatedLayer`; other kinds (the recurrent states of hybrid models) stay as they are."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer() if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) else layer
                    for layer in cache.layers]
    return cache


def cache_keyword(hf_model: Any) -> str:
    """The name ``hf_model``'s forward takes its cache by: ``cache`` where it takes that, else
    ``past_key_values``. transformers renamed the argument (in 5.24 the old name warns that it goes in
    5.40); 5.17 (the GPU machines') and models with their own code know only ``past_key_values``."""
    return _keyword_of(type(hf_model))


@functools.lru_cache(maxsize=None)
def _keyword_of(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def cache_argument(hf_model: Any, cache: Any) -> dict[str, Any]:
    """``{cache_keyword(hf_model): cache}``, for eager calls. A compiled step reads the keyword from its
    cache instead (:attr:`StaticKVCache.keyword`): a lookup here would put a guard in its graphs."""
    return {cache_keyword(hf_model): cache}
