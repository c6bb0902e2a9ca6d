"""A draft's LM head over part of the vocabulary (FR-Spec, Zhao et al. 2025): cheaper drafting, still exact.

A small draft spends much of its step in its LM head: the int8 Qwen2.5-Coder 0.5B's head (151,936 x 896) takes
12.4 ms of a 61.8 ms one-token step on the AMX Xeon. :func:`restricted_draft` gives a draft model whose head
computes the logits of the vocabulary's first ``n`` ids only (and the end-of-sequence ids) and puts -inf
everywhere else. Byte-level BPE tokenizers number their tokens in merge order, most frequent first: the first
65,536 of Qwen's 151,936 ids cover 99.0% of the int8 1.5B's HumanEval completion tokens.

Exactness does not depend on the cut: speculative sampling is exact for any draft distribution q, and q is
simply 0 on the ids left out (the target's residual max(0, p - q) keeps their mass); under greedy verification
the draft just cannot propose them. The kept rows of the head are the full head's rows, so the kept logits are
the full head's bit for bit (per-row int8 or int4 quantization; a float head copies its rows).

Shape notes: hidden [..., H] -> kept logits [..., K] -> logits [..., V].
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch

from specdec.errors import SpecDecError


def kept_ids(n: int, vocab_size: int, always: set[int] | frozenset[int] = frozenset()) -> torch.Tensor:
    """[K] long (on the CPU), sorted: ids 0 .. n - 1 and ``always`` (the end-of-sequence ids), within the vocabulary."""
    return torch.tensor(sorted(set(range(min(n, vocab_size))) | {i for i in always if 0 <= i < vocab_size}))


def _head_rows(head: Any, keep: torch.Tensor) -> torch.nn.Module:
    """A head of the same kind computing only the rows ``keep`` (on the head's device) of ``head`` (an int8
    layer or nn.Linear)."""
    from specdec.models.quantized.int4 import Int4Linear, Int4Weight
    from specdec.models.quantized.int8_weights import is_per_channel
    from specdec.models.quantized.quantize import Int8Linear

    if isinstance(head, Int8Linear) and isinstance(head._packed, Int4Weight):  # an int4 head (never packed later)
        return Int4Linear(head._packed.select(keep), head.bias[keep] if head.bias is not None else None)
    if isinstance(head, Int8Linear):
        q = head.weight()  # [V, H] qint8
        ints = q.int_repr()[keep]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # quantized tensor creation is deprecated upstream, present in 2.13
            if is_per_channel(q):
                sub = torch._make_per_channel_quantized_tensor(ints, q.q_per_channel_scales()[keep],
                                                               q.q_per_channel_zero_points()[keep], 0)
            else:
                sub = torch._make_per_tensor_quantized_tensor(ints, q.q_scale(), q.q_zero_point())
        return Int8Linear.from_qweight(sub, head.bias[keep] if head.bias is not None else None)
    if isinstance(head, torch.nn.Linear):
        rows = torch.nn.Linear(head.in_features, keep.numel(), bias=head.bias is not None,
                               device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            rows.weight.copy_(head.weight[keep])
            if head.bias is not None:
                rows.bias.copy_(head.bias[keep])
        return rows
    raise SpecDecError(f"cannot restrict a draft head of type {type(head).__name__} (an int8 or a linear head can be)")


class SubsetHead(torch.nn.Module):
    """The LM head over the ids ``keep`` ([K], on the head's device): their logits, -inf for every other id (see
    the module docstring)."""

    def __init__(self, head: Any, keep: torch.Tensor, vocab_size: int):
        super().__init__()
        self.rows = _head_rows(head, keep)
        self.out_features = vocab_size  # V: what LanguageModel.vocab_size reads
        # the kept ids' leading run 0 .. n - 1 (a cut's first n ids) goes over as one slice copy, the rest one by one
        # (index_copy_ of all 65,538 took ~0.15 ms of the 0.5B's step)
        leading = (keep == torch.arange(keep.numel(), device=keep.device)).int().cumprod(0)
        self.leading = int(leading.sum())
        self.register_buffer("rest", keep[self.leading:], persistent=False)  # [K - n]: the kept ids past the run

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        kept = self.rows(hidden)  # [..., K]
        logits = kept.new_full((*kept.shape[:-1], self.out_features), float("-inf"))  # [..., V]
        n = self.leading
        logits[..., :n] = kept[..., :n]
        return logits.index_copy_(logits.dim() - 1, self.rest, kept[..., n:])


def restricted_draft(model: Any, n: int) -> Any:
    """A copy of ``model`` (a LanguageModel) whose head keeps the first ``n`` ids and the end-of-sequence ids.

    The copy shares everything but the head (the body's weights, the tokenizer); ``model`` is unchanged."""
    vocab = model.vocab_size
    if n < 1:
        raise SpecDecError(f"a draft vocabulary must keep at least 1 id, got {n} (e.g. @65536)")
    if n >= vocab:
        return model
    hf = model.hf_model
    head = hf.get_output_embeddings()
    restricted_hf = copy.copy(hf)  # a new module object ...
    restricted_hf._modules = dict(hf._modules)  # ... with its own table of children: only the head differs
    keep = kept_ids(n, vocab, set(model.eos_token_ids)).to(model.device)  # [K]
    restricted_hf.set_output_embeddings(SubsetHead(head, keep, vocab))
    restricted = copy.copy(model)
    restricted.hf_model = restricted_hf
    restricted.name = f"{model.name}@{n}"
    restricted.configure(model.engine, model.cuda_graphs, model.compile)  # its own caches and steps
    return restricted
