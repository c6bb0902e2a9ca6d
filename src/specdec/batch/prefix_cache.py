"""Keys and values kept across requests: a later request whose prompt begins as an earlier sequence did (a
conversation's next turn, a shared system prompt, an editor resending a file) starts from the longest kept prefix
and prefills only the rest (what llama-server's ``cache_prompt`` and vLLM's prefix caching do).

    cache = PrefixCache(budget_bytes=1 << 30)
    cache.store(ids, target_kv, draft_kv)        # a finished sequence: ids [n], per layer [1, H_kv, >= n, D]
    hit = cache.lookup(prompt_ids)                # the longest kept prefix: hit.length, hit.target, hit.draft

Entries are the sequences of finished requests, least recently used out first once the kept keys and values pass
the budget; a sequence that extends a kept one replaces it (it holds that prefix too). A lookup compares the
prompt with each entry (the longest common prefix of token ids: a linear scan, cheap next to a prefill at the
entry counts a budget holds).

With a block-invariant target (int8 / int4: :mod:`specdec.models.native.row_attention`) a position's keys and values are
the same bits however the passes that computed them were split, so a request that reuses a prefix gets the logits
an uncached one gets, bit for bit (tests/test_prefix_cache.py): the batch engine keeps this cache for such targets
only (:class:`~specdec.batch.engine.BatchEngine`, ``prefix_cache_bytes``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Sequence

import torch

from specdec.models.sessions.session import common_prefix_length

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), [1, H_kv, n, D] each

MIN_REUSE = 16  # a shorter common prefix is prefilled again (the copy and the bookkeeping would not pay)


def _bytes(kv: KV | None) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv) if kv else 0


def _kept(kv: KV | None, length: int) -> KV | None:
    """Copies of the first ``length`` positions (the buffers they came from go on being written)."""
    if kv is None:
        return None
    return [(k[..., :length, :].clone(), v[..., :length, :].clone()) for k, v in kv]


@dataclass
class Entry:
    ids: tuple[int, ...]  # the positions the target's keys and values hold
    target: KV
    draft: KV | None  # the draft model's, for a prefix of ids (draft_length positions), or None
    draft_length: int
    size: int  # bytes


@dataclass(frozen=True)
class Hit:
    length: int  # positions of the prompt the entry holds (target)
    target: KV
    draft: KV | None
    draft_length: int  # positions of the prompt the entry's draft keys and values hold (<= length)


class PrefixCache:
    """Finished sequences' keys and values (the target's, and a model draft's), at most ``budget_bytes``."""

    def __init__(self, budget_bytes: int):
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache's budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = budget_bytes
        self.entries: collections.OrderedDict[tuple[int, ...], Entry] = collections.OrderedDict()  # oldest first
        self.size = 0
        self.hits = self.lookups = self.evicted = 0
        self.reused_tokens = 0

    def lookup(self, ids: Sequence[int], limit: int | None = None) -> Hit | None:
        """The entry sharing the longest prefix with ``ids`` (at most ``limit`` positions of it), None below
        MIN_REUSE; a hit becomes the most recently used."""
        self.lookups += 1
        ids = list(ids)
        best, length = None, 0
        for entry in self.entries.values():
            n = common_prefix_length(entry.ids, ids)
            if n > length:
                best, length = entry, n
        length = min(length, limit if limit is not None else length)
        if best is None or length < MIN_REUSE:
            return None
        self.entries.move_to_end(best.ids)
        self.hits += 1
        self.reused_tokens += length
        return Hit(length, best.target, best.draft, min(best.draft_length, length))

    def store(self, ids: Sequence[int], target: KV, draft: KV | None = None, draft_length: int = 0) -> bool:
        """Keep the keys and values of ``ids`` (``target``: per layer, at least len(ids) positions; ``draft``: a
        model draft's, its first ``draft_length`` positions). False where one entry alone would pass the budget."""
        ids = tuple(int(t) for t in ids)
        draft_length = min(draft_length, len(ids)) if draft is not None else 0
        kept, kept_draft = _kept(target, len(ids)), _kept(draft, draft_length) if draft_length else None
        size = _bytes(kept) + _bytes(kept_draft)
        if not ids or size > self.budget:
            return False
        for key in [key for key in self.entries if ids[: len(key)] == key]:  # held by the new one too
            self._drop(key)
        if ids in self.entries:
            self._drop(ids)
        while self.entries and self.size + size > self.budget:
            self._drop(next(iter(self.entries)))
            self.evicted += 1
        self.entries[ids] = Entry(ids, kept, kept_draft, draft_length, size)
        self.size += size
        return True

    def _drop(self, key: tuple[int, ...]) -> None:
        self.size -= self.entries.pop(key).size

    def report(self) -> dict[str, int]:
        return {"entries": len(self.entries), "bytes": self.size, "budget_bytes": self.budget, "lookups": self.lookups,
                "hits": self.hits, "reused_tokens": self.reused_tokens, "evicted": self.evicted}
