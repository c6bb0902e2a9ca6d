"""Model sessions: one sequence's KV cache in one model, driven by position.

The engine talks to a model through three calls (as gpt-fast's loop does):

    session.prefill(prompt_ids)         # cache the prompt (eager)
    logits = session.extend(tokens, n)  # feed tokens [k] at the end, logits [n, V] of the last n
    session.rollback(length)            # forget every position from ``length`` on

``length`` is the number of positions the cache holds. Rollback is bookkeeping: nothing is
recomputed, and the next ``extend`` writes over the forgotten positions.

Two caches implement it:

- :class:`DynamicSession`: transformers' ``DynamicCache`` with in-place growing buffers
  (:mod:`specdec.models.cache.kv_cache`); attention covers exactly the filled length. The CPU default.
- :class:`StaticSession`: the position-indexed :class:`~specdec.models.cache.static_cache.StaticKVCache`;
  every step has a fixed shape, so on CUDA it is replayed as a captured graph
  (:mod:`specdec.models.sessions.graphs`). The CUDA default.

``forward(sequence, n_logits)`` is a convenience for scripts and tests that think in whole
sequences: it rolls back to the longest common prefix with what the session holds and extends.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import torch

from specdec.models.native import decoder_step
from specdec.models.sessions.graphs import MAX_GRAPH_WIDTH, CapturedStep, graph_for, prefill_chunks, static_step
from specdec.models.cache.kv_cache import PreallocatedLayer, cache_argument, preallocated_cache
from specdec.models.cache.static_cache import StaticKVCache


class SessionModel(Protocol):
    """What a session reads of its model (a :class:`~specdec.models.causal.LanguageModel`, which builds the
    sessions: declared here so that this module needs nothing of that one)."""

    hf_model: Any  # the transformers module
    cuda_graphs: bool

    @property
    def device(self) -> torch.device: ...

    def acquire_cache(self, max_positions: int | None) -> StaticKVCache: ...

    def release_cache(self, cache: StaticKVCache) -> None: ...

    def captured_step(self, cache: StaticKVCache, width: int) -> CapturedStep: ...


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ModelSession:
    """The calls every session offers; subclasses implement ``_extend`` and ``_truncate``."""

    def __init__(self, model: SessionModel):
        self.model = model
        self.device = model.device
        self.length = 0  # positions held by the cache
        self.forward_passes = 0
        self.last_pass_tokens = 0  # tokens the last forward pass computed (what its time depends on)
        self.tokens: list[int] | None = []  # host copy of the cached ids, kept while only host ids were fed

    def _ids(self, tokens: torch.Tensor | Sequence[int]) -> torch.Tensor:
        if isinstance(tokens, torch.Tensor):
            self.tokens = None  # device tokens: no host copy without a sync
            return tokens.to(self.device).reshape(-1)  # already there in the loop (a no-op)
        if self.tokens is not None:
            self.tokens.extend(int(t) for t in tokens)
        return torch.tensor(list(tokens), dtype=torch.long, device=self.device)  # host ids: a plain copy

    def prefill(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor | None:
        """Cache ``ids`` (the prompt, or most of it); returns the logits [V] of the last one (None if empty)."""
        if len(ids) == 0:
            return None
        return self.extend(ids, 1)[0]

    def extend(self, tokens: torch.Tensor | Sequence[int], n_logits: int = 1) -> torch.Tensor:
        """Feed ``tokens`` [k] after the cached positions; logits [n_logits, V] of the last n_logits of them.

        Row i predicts the token that follows tokens[k - n_logits + i].
        """
        ids = self._ids(tokens)  # [k]
        k = int(ids.shape[0])
        if not 1 <= n_logits <= k:
            raise ValueError(f"asked for {n_logits} logits of {k} new tokens")
        with torch.inference_mode():
            logits = self._extend(ids, n_logits)
        self.length += k
        self.forward_passes += 1
        self.last_pass_tokens = k
        return logits

    def rollback(self, length: int) -> None:
        """Keep positions [0, length) only (a no-op when length >= self.length)."""
        if length < 0:
            raise ValueError(f"cannot roll back to a negative length {length}")
        if length < self.length:
            self._truncate(length)
            self.length = length
            if self.tokens is not None:
                del self.tokens[length:]

    def advanced(self, length: int, passes: int, tokens: int) -> None:
        """Bookkeeping after passes made outside :meth:`extend` (a captured round, specdec.round_graph): the cache
        now holds ``length`` positions, after ``passes`` forward passes, the last of ``tokens`` tokens."""
        self.length = length
        self.forward_passes += passes
        self.last_pass_tokens = tokens
        self.tokens = None  # fed from the device: no host copy

    def logits_of(self, sequence: Sequence[int], n_logits: int) -> torch.Tensor:
        """Logits [n_logits, V] for the last ``n_logits`` positions of the whole ``sequence`` (host ids): the
        cached common prefix is kept, the rest rolled back and fed (not a forward pass of its own)."""
        if self.tokens is None:
            raise RuntimeError("logits_of(sequence) needs a session fed with host token ids only; use extend/rollback")
        keep = min(common_prefix_length(self.tokens, sequence), len(sequence) - n_logits)
        if keep < 0:
            raise ValueError(f"asked for {n_logits} logits of a {len(sequence)}-token sequence")
        self.rollback(keep)
        return self.extend(list(sequence[keep:]), n_logits)

    def close(self) -> None:
        """Give shared resources back (a static cache returns to its model's pool)."""

    @property
    def capacity(self) -> int | None:
        """The most positions this session can hold (None: as many as the model's context)."""
        return None

    def _extend(self, ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        raise NotImplementedError

    def _truncate(self, length: int) -> None:
        raise NotImplementedError


class DynamicSession(ModelSession):
    """transformers' DynamicCache with preallocated in-place layers; attention over the filled length."""

    def __init__(self, model: SessionModel, max_positions: int | None = None):
        super().__init__(model)
        self.cache = self._new_cache()

    def _new_cache(self):
        return preallocated_cache(self.model.hf_model.config)

    def _run(self, new: torch.Tensor, n_logits: int) -> torch.Tensor:
        """One forward pass over new [1, k] with the cache; logits [1, >= n_logits, V]. A cached step of an int8 /
        int4 model on specdec's extension runs as one extension call (:mod:`specdec.models.native.decoder_step`, the same
        bits)."""
        if self.length and getattr(self.model, "block_invariant", False):
            logits = decoder_step.step(self.model.hf_model, self.cache, new, n_logits)
            if logits is not None:
                return logits
        return self.model.hf_model(
            input_ids=new, use_cache=True, logits_to_keep=n_logits, **cache_argument(self.model.hf_model, self.cache)
        ).logits

    def _extend(self, ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        return self._run(ids[None], n_logits)[0, -n_logits:]  # [n_logits, V]

    def kv(self) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Per layer the cached keys and values, [1, H_kv, length, D] views (None: a cache with layers of
        another kind, the recurrent states of a hybrid model, which this copy cannot carry)."""
        if not all(isinstance(layer, PreallocatedLayer) and layer.is_initialized for layer in self.cache.layers):
            return None
        return [(layer.keys, layer.values) for layer in self.cache.layers]

    def adopt(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Hold ``length`` positions whose keys and values per layer are ``layers`` ([1, H_kv, >= length, D]
        each), copied: the cache a prefill of those tokens leaves, where they were computed by the same
        block-invariant passes (a batch row going on alone: :mod:`specdec.batch.alone`)."""
        if not length:
            return
        if self.length or len(layers) != len(self.cache.layers):
            raise ValueError(f"adopt fills a fresh session ({self.length} positions held) with one entry per layer "
                             f"({len(layers)} for {len(self.cache.layers)})")
        with torch.inference_mode():  # what every pass writes into the buffers runs in inference mode
            for layer, (keys, values) in zip(self.cache.layers, layers):
                layer.update(keys[..., :length, :], values[..., :length, :])
        self.length = length
        self.tokens = None  # no host copy of the ids

    def _truncate(self, length: int) -> None:
        # crop(-n) only removes positions: crop(0) would also trim sliding-window layers (Gemma 3) to
        # their window and forget the past a later rollback may need.
        self.cache.crop(-(self.length - length))


class StaticSession(ModelSession):
    """The position-indexed static cache; fixed-width steps replayed as CUDA graphs on CUDA.

    max_positions: the most positions this generation can reach (prompt + new tokens); the cache
    taken from the model's pool holds at least that plus the widest padded step.
    """

    def __init__(self, model: SessionModel, max_positions: int | None = None):
        super().__init__(model)
        self.cache: StaticKVCache = model.acquire_cache(max_positions)

    def _extend(self, ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        k = int(ids.shape[0])
        if self.length + k > self.cache.capacity:
            raise ValueError(f"the static cache holds {self.cache.capacity} positions; {self.length + k} asked")
        if self.model.cuda_graphs and n_logits == 1 and (self.length == 0 or k > MAX_GRAPH_WIDTH):
            chunks = prefill_chunks(self.cache, self.length, k)  # [] on a cache never prepared: eager
            if chunks:
                done, logits = 0, None
                for size, prefill in chunks:
                    logits = prefill(ids[done: done + size], self.length + done)  # [1, V]
                    done += size
                return logits
        step = None
        if self.model.cuda_graphs and self.length > 0:  # an unprepared cache's prefill (length 0) runs eagerly
            step = graph_for(self.cache, k, self.model.captured_step)
            if step is not None and self.length + step.width > self.cache.capacity:
                step = None  # the padding would run past the buffers
        if step is not None:
            return step(ids, self.length)[k - n_logits:]  # [n_logits, V]
        start = torch.full((1,), self.length, dtype=torch.long, device=self.device)
        return static_step(self.model.hf_model, self.cache, ids[None], start, n_logits)[-n_logits:].clone()

    def _truncate(self, length: int) -> None:
        return None  # stale positions are masked, then overwritten

    @property
    def capacity(self) -> int | None:
        return self.cache.capacity - MAX_GRAPH_WIDTH  # room kept for the widest padded step

    def close(self) -> None:
        if self.cache is not None:
            self.model.release_cache(self.cache)
            self.cache = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
