"""A batched KV cache used functionally: each forward pass returns a new cache and keeps the old one."""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache

from specdec.models import LanguageModel

def fork_cache(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A new cache holding ``rows`` [B] of ``cache``; ``cache`` itself is left unchanged."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    new.batch_select_indices(rows)  # advanced indexing: the new layers own new tensors
    return new


class BatchKV:
    """The KV cache of a batch of sequences of one length: a batched :class:`~specdec.models.KVSession`.

    ``forward`` returns a NEW object and leaves this one valid (selecting rows copies them, and the
    forward pass concatenates new tensors), so earlier states can be kept as snapshots.
    Rollback is position bookkeeping: each asked-for sequence is matched with the cached row sharing its
    longest prefix; the cache is cropped to the shortest such match and only the rest is fed.
    """

    def __init__(self, model: LanguageModel, cache: DynamicCache | None = None, tokens: torch.Tensor | None = None,
                 fed: int = 0):
        self.model = model
        self.fed = fed  # positions the forward pass that made this cache computed (batch x new length)
        if cache is None:
            cache = DynamicCache(config=model.hf_model.config)
            cache.activate_past_recording()  # sliding-window layers keep their past until crop()
        self.cache = cache
        self.tokens = tokens if tokens is not None else torch.empty(1, 0, dtype=torch.long, device=model.device)  # [R, Lc]

    def reuse(self, seqs: torch.Tensor, n_logits: int) -> tuple[torch.Tensor, int]:
        """For seqs [B, L]: the cached row each continues from [B], and how many positions to keep."""
        m = min(seqs.shape[1], self.tokens.shape[1])
        if m == 0:
            return torch.zeros(seqs.shape[0], dtype=torch.long, device=seqs.device), 0
        same = seqs[:, None, :m] == self.tokens[None, :, :m]  # [B, R, m]
        lcp = same.long().cumprod(-1).sum(-1)  # [B, R]
        best, rows = lcp.max(-1)  # [B], [B]
        return rows, min(int(best.min()), seqs.shape[1] - n_logits)

    def forward(self, seqs: torch.Tensor, n_logits: int) -> tuple["BatchKV", torch.Tensor]:
        """Logits [B, n_logits, V] for the last n_logits positions of seqs [B, L], and the cache of seqs."""
        rows, keep = self.reuse(seqs, n_logits)
        cache = fork_cache(self.cache, rows)
        drop = self.tokens.shape[1] - keep
        if drop > 0:
            cache.crop(-drop)
        logits = self.model.hf_model(
            input_ids=seqs[:, keep:], past_key_values=cache, use_cache=True, logits_to_keep=n_logits
        ).logits
        fed = seqs.shape[0] * (seqs.shape[1] - keep)
        return BatchKV(self.model, cache, seqs.clone(), fed), logits[:, -n_logits:]


def best_snapshot(snapshots: list[BatchKV], seqs: torch.Tensor) -> BatchKV:
    """The snapshot that needs the fewest new positions fed to reach seqs (the latest among equals)."""
    keeps = [kv.reuse(seqs, 1)[1] for kv in snapshots]
    return snapshots[max(range(len(keeps)), key=lambda i: (keeps[i], i))]

