"""The KV cache of a beam batch: the core's position-indexed buffers with one row per sequence.

Every row of a beam batch has the same length (beam search extends all running beams by one token,
and the tree paths are padded to one length), so the batch is one
:class:`~specdec.models.cache.static_cache.StaticKVCache` whose buffers are [R, H_kv, C, D] (allocated by
the first pass with its batch size R) and one length shared by the rows:

- feeding k tokens per row writes them at positions [length, length + k); the masks [1, 1, k, C]
  of the core broadcast over the rows;
- rollback lowers the length: stale positions are masked, then overwritten (attention reads the
  whole capacity, as in the core: attending to the filled length only changes the last bits of the
  scores, enough to break bit-equality with transformers' scores in tests/test_beam.py);
- selecting rows (a beam step's reorder, 1 prompt row to w beams, w beams to the B tree paths and
  back) is one gather of the buffers along the row dimension, as transformers' beam search reorders
  its cache; the gather is skipped when the rows stay as they are.

:meth:`BatchKV.forward` takes whole sequences: each is matched with the cached row sharing its
longest prefix, the rows are gathered, the length lowered to the shortest such match, and only the
rest is fed.
"""

from __future__ import annotations

import torch

from specdec.models import LanguageModel
from specdec.models.cache.kv_cache import cache_keyword
from specdec.models.cache.static_cache import MIN_CAPACITY, StaticKVCache


def initial_capacity(prompt_length: int, limit: int) -> int:
    """Positions to allocate for a search of at most ``limit`` new tokens (more are added on demand)."""
    return prompt_length + min(limit, MIN_CAPACITY)


class BatchKV:
    """A batch of sequences of one length in position-indexed buffers; forward passes update it in place.

    capacity: the positions allocated per row (see :func:`initial_capacity`); doubled when a pass
    needs more.
    """

    def __init__(self, model: LanguageModel, capacity: int):
        self.model = model
        self.cache = StaticKVCache(model.hf_model.config, capacity, model.device, model.dtype,
                                   cache_keyword(model.hf_model))
        self.tokens = torch.empty(1, 0, dtype=torch.long, device=model.device)  # [R, length] ids held per row
        self.fed = 0  # positions the last forward pass computed (rows x new tokens)
        self.shared = False  # the buffers are another handle's too (see branch)

    @property
    def length(self) -> int:
        return int(self.tokens.shape[1])

    def branch(self) -> "BatchKV":
        """A second handle on the same state whose next :meth:`forward` gathers (copies) its rows first,
        so that neither handle writes into buffers the other reads (report mode: beams share a cache)."""
        other = BatchKV(self.model, self.cache.capacity)
        other.cache.keys, other.cache.values = list(self.cache.keys), list(self.cache.values)
        other.tokens, other.shared = self.tokens, True
        return other

    def select(self, rows: torch.Tensor, copy: bool = False) -> None:
        """Keep rows [B] (indices into the current rows, repeats allowed): one gather per buffer."""
        if not copy and rows.numel() == self.tokens.shape[0] and bool((rows == torch.arange(
                rows.numel(), device=rows.device)).all()):
            return
        cache = self.cache
        for layer, (keys, values) in enumerate(zip(cache.keys, cache.values)):
            if keys is not None:  # [R, H_kv, C, D] -> [B, H_kv, C, D]
                cache.keys[layer], cache.values[layer] = keys.index_select(0, rows), values.index_select(0, rows)
        self.tokens = self.tokens.index_select(0, rows)

    def rollback(self, length: int) -> None:
        """Keep positions [0, length) of every row."""
        self.tokens = self.tokens[:, :length]

    def reuse(self, seqs: torch.Tensor, n_logits: int) -> tuple[torch.Tensor, int]:
        """For seqs [B, L]: the cached row each continues from [B], and how many positions to keep."""
        m = min(seqs.shape[1], self.length)
        if m == 0:
            return torch.zeros(seqs.shape[0], dtype=torch.long, device=seqs.device), 0
        same = seqs[:, None, :m] == self.tokens[None, :, :m]  # [B, R, m]
        lcp = same.long().cumprod(-1).sum(-1)  # [B, R]
        best, rows = lcp.max(-1)  # [B], [B]
        return rows, min(int(best.min()), seqs.shape[1] - n_logits)

    def forward(self, seqs: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Logits [B, n_logits, V] for the last n_logits positions of seqs [B, L]; the cache then holds seqs."""
        rows, keep = self.reuse(seqs, n_logits)
        self.select(rows, copy=self.shared)
        self.shared = False
        self.rollback(keep)
        return self.extend(seqs[:, keep:], n_logits)

    def extend(self, new: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Feed new [B, k] after every row's cached positions; logits [B, n_logits, V] of the last n_logits."""
        rows, k = new.shape
        start = self.length
        if start + k > self.cache.capacity:
            self._grow(max(start + k, 2 * self.cache.capacity))
        positions = torch.arange(start, start + k, device=new.device)  # [k], shared by the rows
        cache = self.cache
        cache.positions = positions
        masks = cache.attention_masks(positions, cache.dtype)  # [1, 1, k, C] each, broadcast over rows
        mask = masks if len(masks) > 1 else masks["full_attention"]
        logits = self.model.hf_model(
            input_ids=new, position_ids=positions[None].expand(rows, -1), attention_mask=mask,
            use_cache=True, logits_to_keep=n_logits, **{cache.keyword: cache},
        ).logits
        self.tokens = torch.cat([self.tokens, new], dim=1)  # [B, length + k]
        self.fed = rows * k
        return logits[:, -n_logits:]

    def _grow(self, capacity: int) -> None:
        """Move the buffers into a cache of ``capacity`` positions (the new positions are zeros)."""
        old = self.cache
        self.cache = StaticKVCache(self.model.hf_model.config, capacity, old.device, old.dtype, old.keyword)
        pad = [0, 0, 0, capacity - old.capacity]  # the position dimension of [R, H_kv, C, D]
        self.cache.keys = [None if t is None else torch.nn.functional.pad(t, pad) for t in old.keys]
        self.cache.values = [None if t is None else torch.nn.functional.pad(t, pad) for t in old.values]
