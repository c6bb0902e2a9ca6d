"""Exact speculative beam search (paper Appendix A.4): the draft's beam tree, one target pass over it,
then as many of the target's own beam steps as the pass holds logits for."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.beam.batch_kv import BatchKV, initial_capacity
from specdec.beam.drafts import ModelDraft, ProbabilityDraft
from specdec.beam.state import BeamState


def exact_beam_search(target, prompt, w, u, limit, kind, draft_obj, gamma, length_penalty, early_stopping,
                       eos, generator, stats, clock) -> tuple[list[int], float]:
    vocab = target.vocab_size
    eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=prompt.device)
    state = BeamState(w, limit, eos_t, length_penalty, early_stopping)

    capacity = initial_capacity(prompt.numel(), limit)
    tkv = BatchKV(target, capacity)  # rows: the running beams, or the tree's paths during a round

    def target_forward(seqs: torch.Tensor, n_logits: int) -> torch.Tensor:
        t0 = clock()
        logits = tkv.forward(seqs, n_logits)
        stats["time_target_s"] += clock() - t0
        stats["target_calls"] += 1
        stats["target_positions"] += tkv.fed
        return logits.float()

    # Prefill the prompt once (batch 1); its logits are the first step's for all w (identical) beams.
    logits = target_forward(prompt[None], 1)
    state.step(F.log_softmax(logits[:, -1], dim=-1).expand(w, -1))

    draft = None
    if kind is not None:
        if kind == "model":
            draft = ModelDraft(draft_obj, vocab, capacity)
        else:
            draft = ProbabilityDraft(draft_obj, vocab, eos, generator, prompt.device)
        t0 = clock()
        draft.start(prompt)  # a draft model prefills the prompt once too
        stats["time_draft_s"] += clock() - t0
        stats["draft_calls"] += draft.calls

    while not state.done:
        g = min(gamma, state.n - state.cur - 1) if draft is not None else 0
        roots = state.running(prompt)  # [w, L]
        if g <= 0:  # plain beam step
            logits = target_forward(roots, 1)
            state.step(F.log_softmax(logits[:, -1], dim=-1))
            continue
        # 1. the draft's own beam search of width u for g steps, from the target's running beams
        t0 = clock()
        calls_before = draft.calls
        levels = _draft_tree(draft, roots, state.run_scores.clone(), u, g, eos_t, vocab)
        stats["draft_calls"] += draft.calls - calls_before
        stats["time_draft_s"] += clock() - t0
        # 2. one target pass over every root-to-leaf path of the tree
        paths, where = _tree_paths(roots, levels)
        logits = target_forward(paths, g + 1)  # [B, g + 1, V]
        stats["rounds"] += 1
        stats["drafted_steps"] += g
        # 3. target beam steps while its running beams are nodes of the tree
        nodes = torch.arange(w, device=prompt.device)  # the running beams' nodes at the current level
        for level in range(g + 1):
            parents = state.step(F.log_softmax(logits[where[level][nodes], level], dim=-1))
            stats["accepted_steps"] += 1 if level > 0 else 0
            if state.done:  # the search ended: the deeper levels were not needed, not rejected
                stats["drafted_steps"] -= g - level
                break
            if level == g:
                break
            found = _children(levels[level], nodes[parents], state.run_tokens[:, state.cur - 1])
            if found is None:  # the target chose a beam the draft did not keep: continue from here
                break
            nodes = found
        if not state.done:
            t0 = clock()
            draft.end_round(state.running(prompt))
            stats["time_draft_s"] += clock() - t0
    stats["steps"] = state.cur
    return state.best()


def _draft_tree(draft, roots: torch.Tensor, scores: torch.Tensor, u: int, g: int, eos: torch.Tensor,
                vocab: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The draft's beam search: levels[k] = (parents [n] into level k, tokens [n], seqs [n, L + k + 1]).

    roots: [w, L] the target's running beams (level 0); scores: [w] their summed log-probabilities.
    EOS continuations are excluded: the target finishes them, it never needs their logits.
    """
    levels = []
    seqs = roots
    for _ in range(g):
        log_q = draft.log_q(seqs)  # [n, V]
        if eos.numel():
            log_q[:, eos] = float("-inf")
        candidates = (scores[:, None] + log_q).reshape(-1)  # [n * V]
        scores, index = torch.topk(candidates, k=min(u, candidates.numel()))
        parents, tokens = index // vocab, index % vocab
        seqs = torch.cat([seqs[parents], tokens[:, None]], dim=1)
        levels.append((parents, tokens, seqs))
    return levels


def _tree_paths(roots: torch.Tensor, levels) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Every root-to-node path of the tree that is not part of a longer one, padded to one length.

    Returns paths [B, L + g] (the padding repeats a path's last token; causal attention keeps it from
    touching the real positions) and where[k] [n_k]: the path row holding node i of level k.
    """
    g = len(levels)
    sizes = [roots.shape[0]] + [lv[0].shape[0] for lv in levels]
    where = [torch.full((n,), -1, dtype=torch.long) for n in sizes]  # host bookkeeping, moved at the end
    seqs = [roots] + [lv[2] for lv in levels]
    rows: list[torch.Tensor] = []
    for k in range(g, -1, -1):  # deepest first: a shallower node mostly lies on a deeper path already
        for i in range(sizes[k]):
            if where[k][i] >= 0:
                continue
            row = len(rows)
            seq = seqs[k][i]
            rows.append(torch.cat([seq, seq[-1:].expand(g - k)]))
            node = i
            for j in range(k, -1, -1):  # mark the node and its ancestors
                if where[j][node] >= 0:
                    break
                where[j][node] = row
                if j > 0:
                    node = int(levels[j - 1][0][node])
    return torch.stack(rows), [w.to(roots.device) for w in where]


def _children(level, parent_nodes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor | None:
    """Nodes of the next tree level for (parent node, token) pairs [w], or None if one is missing."""
    parents, toks, _ = level
    index = {(int(p), int(t)): i for i, (p, t) in enumerate(zip(parents.tolist(), toks.tolist()))}
    found = [index.get((int(p), int(t))) for p, t in zip(parent_nodes.tolist(), tokens.tolist())]
    if any(f is None for f in found):
        return None
    return torch.tensor(found, dtype=torch.long, device=parent_nodes.device)

