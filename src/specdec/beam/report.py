"""The student report's Algorithm 2: every beam advanced by speculative sampling (approximate)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.acceptance import verify
from specdec.beam.batch_kv import BatchKV, initial_capacity
from specdec.drafters.model import fit_width
from specdec.models import LanguageModel
from specdec.sampling import SamplingParams, sample, standardize


@dataclass
class _Hypothesis:
    tokens: list[int]  # generated tokens
    score: float  # summed log-probability under the target
    ended: bool
    tkv: BatchKV
    dkv: BatchKV | None


def report_beam_search(target, prompt, k, limit, kind, draft_obj, gamma, length_penalty, eos, generator,
                        stats, clock) -> tuple[list[int], float]:
    """The report's Algorithm 2: every beam advanced by speculative sampling, the best k kept.

    Two readings are needed to make it a beam search: each beam draws k candidates (k independent
    speculative-sampling chains; literally one candidate per beam would keep a single beam forever),
    identical candidates are merged, and a candidate's score is its running log-probability under the
    target, sum log p over all its tokens (the report's line 24 adds log p'(t) of the last token only).
    Sampling is at temperature 1 as in the report. Approximate: the result is neither plain beam search
    nor a sample of the target. The best beam is returned by length-penalised score.
    """
    vocab = target.vocab_size
    sampling = SamplingParams(temperature=1.0)
    drafter = None
    if kind == "drafter":
        from specdec.drafters import DraftContext

        drafter = draft_obj
        drafter.start(DraftContext(prompt.tolist(), sampling, generator, vocab, frozenset(eos), device=prompt.device))
    # Prefill the prompt once (batch 1) for the target and a draft model; the beams' chains reuse it.
    t0 = clock()
    capacity = initial_capacity(prompt.numel(), limit)
    tkv0 = _prefill(target, prompt[:-1], capacity)
    stats["time_target_s"] += clock() - t0
    stats["target_calls"] += int(tkv0.fed > 0)
    stats["target_positions"] += tkv0.fed
    dkv0 = None
    if kind == "model":
        dkv0 = _prefill(draft_obj, prompt[:-1], capacity)
        stats["draft_calls"] += int(dkv0.fed > 0)
    beams = [_Hypothesis([], 0.0, False, tkv0, dkv0)]
    while True:
        active = [b for b in beams if not b.ended and len(b.tokens) < limit]
        if not active:
            break
        stats["rounds"] += 1
        candidates: list[_Hypothesis] = [b for b in beams if b not in active]
        for beam in active:
            seq = torch.cat([prompt, torch.tensor(beam.tokens, dtype=torch.long, device=prompt.device)])  # [L]
            g = min(gamma, limit - len(beam.tokens) - 1) if kind is not None else 0
            # 1. k chains of g drafted tokens each
            t0 = clock()
            chains, q, dkv = _sample_chains(kind, draft_obj, drafter, beam.dkv, seq, k, g, vocab, generator, stats)
            stats["time_draft_s"] += clock() - t0
            g = chains.shape[1] - seq.numel()
            # 2. the target scores all chains in one pass
            t0 = clock()
            tkv = beam.tkv.branch()  # other beams may continue from the same cache
            logits = tkv.forward(chains, g + 1)  # [k, g + 1, V]
            stats["time_target_s"] += clock() - t0
            stats["target_calls"] += 1
            stats["target_positions"] += tkv.fed
            p = standardize(logits, sampling)  # [k, g + 1, V]
            # 3. speculative sampling on each chain; score by the target's log-probabilities
            for c in range(k):
                drafted = chains[c, seq.numel():]
                # the loop's own verification on the device (same draws as speculative_sampling), one read-back
                new, n, _ = verify(logits[c], drafted, None if q is None else q[c], sampling, generator).read()
                stats["drafted_tokens"] += g
                stats["accepted_tokens"] += n
                ended = False
                for j, tok in enumerate(new):
                    if tok in eos:
                        new, ended = new[: j + 1], True
                        break
                logp = float(p[c, torch.arange(len(new), device=p.device), torch.tensor(new, device=p.device)].log().sum())
                candidates.append(_Hypothesis(beam.tokens + new, beam.score + logp, ended, tkv, dkv))
        # 4. the best k distinct candidates by running log-probability
        seen, beams = set(), []
        for cand in sorted(candidates, key=lambda h: h.score, reverse=True):
            key = tuple(cand.tokens)
            if key not in seen:
                seen.add(key)
                beams.append(cand)
            if len(beams) == k:
                break
    stats["steps"] = max(len(b.tokens) for b in beams)
    best = max(beams, key=lambda h: h.score / (max(len(h.tokens), 1) ** length_penalty))
    return best.tokens, best.score / (max(len(best.tokens), 1) ** length_penalty)


def _prefill(model: LanguageModel, ids: torch.Tensor, capacity: int) -> BatchKV:
    """The cache of ids [n] (batch 1); an empty cache when n is 0."""
    kv = BatchKV(model, capacity)
    if ids.numel():
        kv.forward(ids[None], 1)
    return kv


def _sample_chains(kind, model, drafter, dkv, seq, k, g, vocab, generator, stats):
    """k chains seq + x_1..x_g, x_i ~ q_i. Returns chains [k, L + g'], q [k, g', V] or None, the draft's cache."""
    chains = seq.expand(k, -1).clone()  # [k, L]
    if g <= 0 or kind is None:
        return chains, None, dkv
    if kind == "model":
        qs = []
        dkv = dkv.branch()  # other beams may continue from the same cache
        for _ in range(g):
            logits = dkv.forward(chains, 1)
            stats["draft_calls"] += 1
            q = standardize(fit_width(logits[:, -1].float(), vocab), SamplingParams(temperature=1.0))  # [k, V]
            x = sample(q, generator).unsqueeze(-1)  # [k, 1]
            chains = torch.cat([chains, x], dim=1)
            qs.append(q)
        return chains, torch.stack(qs, dim=1), dkv
    drafts = []
    for _ in range(k):
        before = int(getattr(drafter, "forward_passes", 0) or 0)
        drafts.append(drafter.propose(seq.tolist(), g))
        stats["draft_calls"] += int(getattr(drafter, "forward_passes", 0) or 0) - before
    n = min(len(d) for d in drafts)  # chains of one length batch without padding
    if n == 0:
        return chains, None, dkv
    chains = torch.cat([chains, torch.stack([d.tokens[:n] for d in drafts])], dim=1)
    if any(d.q is None for d in drafts):  # no probabilities: one-hot q
        return chains, None, dkv
    return chains, torch.stack([d.q[:n] for d in drafts]), dkv
