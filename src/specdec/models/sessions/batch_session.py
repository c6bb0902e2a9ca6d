"""Several sequences of one model in one position-indexed cache, each at its own length (batched decoding).

The core's :class:`~specdec.models.cache.static_cache.StaticKVCache` with one row per slot: buffers
[R, H_kv, C, D]. Slot i holds a sequence of ``lengths[i]`` positions. One forward pass feeds every
slot 0..B-1 its own tokens (a ragged batch, padded to the widest row), each row written at its own
positions ``lengths[i] ..`` and read through its own mask line, so rows never see each other (a
block-invariant int8 model reads instead each row's own prefix, as the one-sequence engine does, so a
row's bits equal what it gets alone from :func:`specdec.generate`):

- a row fed fewer tokens than the widest is padded; the padding writes stale entries past the row's
  length, which its mask hides (they are its future) and its next tokens overwrite, as a rollback's
  stale entries are (a row fed nothing this pass gets only padding and keeps its length);
- rollback lowers a row's length (bookkeeping only, as in the core);
- a row joins by a prefill of its slot alone (a view of the buffers' row, no copy), and leaves by
  having the last slot's row copied into its place (:meth:`BatchSession.move`), so the live rows are
  always slots 0..B-1 and a pass over them reads a view.

A model on specdec's CPU kernels packs each pass's sequences without padding and runs its decoder layers in one
extension call (:func:`specdec.models.native.decoder_step.step_packed`: the same bits as transformers' padded
forward, which runs otherwise). Beam search keeps its batch (rows of one length) in the same cache class
(:mod:`specdec.beam.batch_kv`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

import torch

from specdec.models.cache.kv_cache import cache_keyword
from specdec.models.native import decoder_step
from specdec.models.native.row_attention import exact_rows
from specdec.models.cache.static_cache import StaticKVCache


VISIBLE_STEP = 64  # the attended length is rounded up to a multiple of this (fewer distinct shapes)


class BatchSession:
    """Up to ``rows`` sequences of ``model`` (a LanguageModel), ``capacity`` positions each (padding included)."""

    def __init__(self, model: Any, rows: int, capacity: int):
        self.model = model
        self.rows = rows
        self.cache = StaticKVCache(model.hf_model.config, capacity, model.device, model.dtype,
                                   cache_keyword(model.hf_model), rows=rows)
        self.lengths = [0] * rows  # positions held per slot
        self.forward_passes = 0
        self.last_pass_tokens = 0  # tokens the last pass fed (padding included): what its time depends on
        self.packed = bool(model.block_invariant) and model.hf_model is not None and decoder_step.packs(
            model.hf_model, self.cache.windows)  # its passes packed, once its buffers exist (step_packed)

    def _packed(self, active: slice, feeds: Sequence[torch.Tensor], lengths: Sequence[int],
                n_logits: Sequence[int]) -> list[torch.Tensor] | None:
        """The pass through :func:`~specdec.models.native.decoder_step.step_packed` (the sequences packed, no
        padding, the same bits), or None where it does not apply (transformers' padded forward runs; it allocates
        the buffers on the first pass)."""
        if not self.packed:
            return None
        with torch.inference_mode():
            out = decoder_step.step_packed(self.model.hf_model, self.cache, active, list(feeds), list(lengths),
                                           list(n_logits))
        if out is not None:
            self.forward_passes += 1
            self.last_pass_tokens = sum(int(f.shape[0]) for f in feeds)
        return out

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def _forward(self, active: slice, ids: torch.Tensor, positions: torch.Tensor, n_logits: int,
                 end: int, spans: list[tuple[int, int]]) -> torch.Tensor:
        """ids / positions [B, w] for the rows of ``active``, none past position ``end``; logits [B, n_logits, V].
        Attention reads positions [0, end rounded up to VISIBLE_STEP) only (what the rows hold). spans: per
        row (first position, tokens fed); a block-invariant model attends each row as it would alone."""
        cache = self.cache
        cache.active, cache.positions = active, positions
        cache.visible = min(self.capacity, -(-end // VISIBLE_STEP) * VISIBLE_STEP)
        masks = cache.attention_masks(positions, cache.dtype)  # [B, 1, w, C] each
        mask = masks if len(masks) > 1 else masks["full_attention"]
        exact = exact_rows(spans) if self.model.block_invariant else contextlib.nullcontext()
        with torch.inference_mode(), exact:
            out = self.model.hf_model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                                      logits_to_keep=n_logits, **{cache.keyword: cache})
        self.forward_passes += 1
        self.last_pass_tokens = int(ids.numel())
        return out.logits[:, -n_logits:]

    def prefill(self, slot: int, ids: Sequence[int], start: int = 0) -> torch.Tensor | None:
        """Start slot ``slot`` over with ``ids`` (host ids, alone in the pass); the logits [1, V] of its last
        position (None if nothing is fed). ``start``: the slot holds ids[:start] already (:meth:`write_row`, a
        prefix kept from an earlier request), so only ids[start:] are fed."""
        self.lengths[slot] = start
        if len(ids) <= start:
            return None
        tokens = torch.tensor([list(ids[start:])], dtype=torch.long, device=self.model.device)  # [1, P]: one upload
        positions = torch.arange(start, len(ids), device=self.model.device)[None]  # [1, P]
        if len(ids) > self.capacity:
            raise ValueError(f"the batch cache holds {self.capacity} positions; {len(ids)} asked")
        packed = self._packed(slice(slot, slot + 1), [tokens[0]], [start], [1])
        if packed is not None:
            self.lengths[slot] = len(ids)
            return packed[0]
        logits = self._forward(slice(slot, slot + 1), tokens, positions, 1, len(ids),
                               [(start, len(ids) - start)])  # [1, 1, V]
        self.lengths[slot] = len(ids)
        return logits[0]

    def extend(self, feeds: Sequence[torch.Tensor], n_logits: Sequence[int]) -> list[torch.Tensor]:
        """Feed slot i (i < len(feeds)) the ids ``feeds[i]`` ([m_i] long on the device; m_i may be 0) after its
        cached positions, all slots in one pass; returns per slot the logits [n_logits[i], V] of its last
        n_logits[i] tokens (row j predicts the token after feeds[i][m_i - n_logits[i] + j])."""
        batch = len(feeds)
        sizes = [int(f.shape[0]) for f in feeds]
        width = max(max(sizes), 1)
        for i, m in enumerate(sizes):
            if self.lengths[i] + width > self.capacity:
                raise ValueError(f"the batch cache holds {self.capacity} positions; row {i} needs "
                                 f"{self.lengths[i] + width}")
        packed = self._packed(slice(0, batch), feeds, self.lengths[:batch], n_logits)
        if packed is not None:
            for i, m in enumerate(sizes):
                self.lengths[i] += m
            return packed
        device = self.model.device
        ids = torch.zeros(batch, width, dtype=torch.long, device=device)  # [B, w], padded with id 0
        for i, f in enumerate(feeds):
            if sizes[i]:
                ids[i, : sizes[i]] = f
        starts = torch.tensor(self.lengths[:batch], dtype=torch.long, device=device)  # [B]: one small upload
        positions = starts[:, None] + torch.arange(width, device=device)  # [B, w]
        logits = self._forward(slice(0, batch), ids, positions, width, max(self.lengths[:batch]) + width,
                               list(zip(self.lengths[:batch], sizes)))  # [B, w, V]
        for i, m in enumerate(sizes):
            self.lengths[i] += m
        return [logits[i, m - n: m] for i, (m, n) in enumerate(zip(sizes, n_logits))]

    def rollback(self, slot: int, length: int) -> None:
        """Keep positions [0, length) of slot ``slot``."""
        if length < self.lengths[slot]:
            self.lengths[slot] = length

    def move(self, src: int, dst: int) -> None:
        """Copy slot ``src``'s row into slot ``dst`` (a row left: the last one takes its place)."""
        if src == dst:
            return
        length = self.lengths[src]
        with torch.inference_mode():  # the buffers were made in inference mode (by the first pass)
            for buffers in (self.cache.keys, self.cache.values):
                for layer in buffers:
                    if layer is not None:  # [R, H_kv, C, D]: the positions the row holds
                        layer[dst, :, :length].copy_(layer[src, :, :length])
        self.lengths[dst] = self.lengths[src]

    def read_row(self, slot: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the keys and values slot ``slot`` holds: [1, H_kv, length, D] views of its buffers ([] when it
        holds none)."""
        length = self.lengths[slot]
        if length and any(k is None for k in self.cache.keys):
            raise ValueError(f"slot {slot} holds {length} positions of buffers never written")
        if not length:  # (nothing written yet: no buffers may exist)
            return []
        return [(k[slot: slot + 1, :, :length], v[slot: slot + 1, :, :length])
                for k, v in zip(self.cache.keys, self.cache.values)]

    def write_row(self, slot: int, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int) -> None:
        """Slot ``slot`` now holds ``length`` positions whose keys and values per layer are ``layers``
        ([1, H_kv, >= length, D] each: a one-sequence session's, :meth:`~specdec.models.sessions.session.DynamicSession.kv`),
        copied: what a prefill of those tokens would have written (the same bits for a block-invariant model)."""
        cache = self.cache
        if not length:
            self.lengths[slot] = 0
            return
        if len(layers) != len(cache.keys):
            raise ValueError(f"{len(layers)} layers of keys and values for a cache of {len(cache.keys)}")
        if length > self.capacity:
            raise ValueError(f"the batch cache holds {self.capacity} positions; {length} asked")
        with torch.inference_mode():  # the buffers are written by passes in inference mode
            for i, (keys, values) in enumerate(layers):
                for buffers, states in ((cache.keys, keys), (cache.values, values)):
                    if buffers[i] is None:  # no pass yet: allocate as the first one would ([R, H_kv, C, D])
                        buffers[i] = states.new_zeros(self.rows, states.shape[1], self.capacity, states.shape[-1])
                    buffers[i][slot, :, :length].copy_(states[0, :, :length])
        self.lengths[slot] = length
