"""A static, position-indexed KV cache (as in gpt-fast): fixed buffers, writes at explicit positions.

Each layer has one key and one value buffer [1, kv_heads, capacity, head_dim], allocated once. A
forward pass over tokens at positions ``pos .. pos + w - 1`` writes their keys and values at exactly
those positions, and attention reads the whole buffer through a mask that lets query position i see
key positions j <= i (and, for a sliding-window layer, j > i - window). So:

- rollback is bookkeeping only: the session forgets positions by lowering its length; the stale
  entries stay in the buffer, are masked as the future of every later query, and are overwritten
  by the next tokens written there;
- every tensor shape depends only on the width w, never on the sequence length, so a step of a
  given width can be captured once as a CUDA graph and replayed at any position
  (:mod:`specdec.models.sessions.graphs`);
- sliding-window layers (Gemma 3) keep every position too (the window lives in the mask), so a
  rollback across the window needs nothing special.

The cache is handed to a Hugging Face model as its cache argument; the model calls
:meth:`StaticKVCache.update` once per layer, and the masks are passed ready-made as
``attention_mask`` so that no mask code of the model has to know this cache.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache

MIN_CAPACITY = 1024  # positions; capacities are powers of two from here, so a model rarely re-allocates


def capacity_for(needed: int, max_context: int | None) -> int:
    """The buffer size for ``needed`` positions: a power of two >= MIN_CAPACITY, within the context."""
    capacity = MIN_CAPACITY
    while capacity < needed:
        capacity *= 2
    if max_context is not None and capacity > max_context >= needed:
        capacity = max_context
    return capacity


def sliding_windows(config: Any) -> list[int | None]:
    """Per layer: the sliding window (tokens) of a sliding-attention layer, None for full attention."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    n_layers = text.num_hidden_layers
    types = getattr(text, "layer_types", None) or ["full_attention"] * n_layers
    window = getattr(text, "sliding_window", None)
    return [window if kind == "sliding_attention" and window else None for kind in types[:n_layers]]


class StaticKVCache(Cache):
    """Key/value buffers of one sequence for every layer, written at ``self.positions``.

    positions: [w] long, the positions of the tokens of the forward pass under way (set by the
    session before each pass, a device tensor, so a captured graph reads its current value).
    """

    is_compileable = True

    def __init__(self, config: Any, capacity: int, device: torch.device, dtype: torch.dtype, keyword: str,
                 rows: int = 0):
        super().__init__(layers=[])
        self.rows = rows  # rows to allocate (a batch of sequences, specdec.batch.engine); 0: as many as the first pass has
        self.active: slice | None = None  # the rows a pass feeds (None: all of them)
        # the positions a pass attends over: [0, visible) (None: the whole capacity, the fixed shape a captured
        # step needs); the batched engine sets it per pass to the longest row's end, so attention costs what
        # the sequences hold, not the capacity
        self.visible: int | None = None
        self.keyword = keyword  # the name the model's forward takes this cache by (kv_cache.cache_keyword)
        self.capacity = capacity
        self.device = device
        self.dtype = dtype
        self.windows = sliding_windows(config)
        self.keys: list[torch.Tensor | None] = [None] * len(self.windows)
        self.values: list[torch.Tensor | None] = [None] * len(self.windows)
        self.positions = torch.zeros(1, dtype=torch.long, device=device)  # [w]
        self._kv_index = torch.arange(capacity, device=device)  # [C]
        self.graphs: dict[int, Any] = {}  # bucket width -> captured step (specdec.models.sessions.graphs), tied to these buffers
        self.prefills: dict[int, Any] = {}  # prefill width -> captured prefill chunk (graphs.CapturedPrefill)
        self.rounds: dict[Any, Any] = {}  # (draft cache id, gamma, sampling) -> captured round (specdec.round_graph)
        self.prepared = False  # True: its graphs were captured ahead (LanguageModel.prepare_steps); it captures no more

    def __len__(self) -> int:
        return len(self.windows)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write key_states / value_states [B, H_kv, w, D] at ``positions`` ([w] shared by the rows, or [B, w]
        per row) of the ``active`` rows; return those rows' whole buffers [B, H_kv, C, D]."""
        if self.keys[layer_idx] is None:  # first pass (the prefill, never captured): allocate
            batch, heads, _, k_dim = key_states.shape
            batch = self.rows or batch
            self.keys[layer_idx] = key_states.new_zeros(batch, heads, self.capacity, k_dim)  # [R, H_kv, C, D]
            self.values[layer_idx] = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        if self.active is not None:  # a slice of the leading dimension: views, no copy
            keys, values = keys[self.active], values[self.active]
        if self.positions.dim() == 1:
            keys.index_copy_(2, self.positions, key_states)
            values.index_copy_(2, self.positions, value_states)
        else:  # ragged rows: row b writes at positions[b]; [B, w] indices put [B, w, H_kv, D] values
            rows = self.row_index(self.positions.shape[0])
            keys[rows, :, self.positions] = key_states.transpose(1, 2)
            values[rows, :, self.positions] = value_states.transpose(1, 2)
        if self.visible is not None:
            return keys[:, :, : self.visible], values[:, :, : self.visible]
        return keys, values

    def row_index(self, batch: int) -> torch.Tensor:
        """[B, 1] long 0..B-1 (kept: one per batch size)."""
        cached = getattr(self, "_row_index", None)
        if cached is None or cached.shape[0] != batch:
            self._row_index = cached = torch.arange(batch, device=self.device)[:, None]
        return cached

    def get_seq_length(self, layer_idx: int = 0) -> int:
        # Only asked by models when no position_ids are passed; specdec always passes them.
        raise RuntimeError("StaticKVCache is driven by explicit positions; pass position_ids")

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.capacity

    def attention_masks(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Additive masks [1, 1, w, C] for queries at ``positions`` [w] ([B, 1, w, C] for per-row positions
        [B, w]): 0 where attention is allowed.

        Returns {"full_attention": mask} and, for models with sliding-window layers,
        "sliding_attention" too (the layer type names Hugging Face models index their masks by).
        """
        q = positions[..., None]  # [w, 1] or [B, w, 1]
        kv = self._kv_index if self.visible is None else self._kv_index[: self.visible]  # [C] (or [visible])
        visible = kv <= q  # [w, C] or [B, w, C]
        blocked = torch.finfo(dtype).min
        head = (lambda m: m[None, None]) if positions.dim() == 1 else (lambda m: m[:, None])

        def additive(allowed: torch.Tensor) -> torch.Tensor:
            # zeros + masked_fill: fill kernels only (no copy from the host), so the step stays capturable
            return head(torch.zeros(allowed.shape, dtype=dtype, device=positions.device).masked_fill_(~allowed, blocked))

        masks = {"full_attention": additive(visible)}
        windows = {w for w in self.windows if w is not None}
        if windows:
            (window,) = windows  # one window size per model (Gemma 3)
            masks["sliding_attention"] = additive(visible & (kv > q - window))
        return masks
