"""The beam search state of transformers' ``_beam_search`` for one batch item."""

from __future__ import annotations

import torch

NEG = -1.0e9  # transformers' "never choose this" score offset, reproduced bit for bit


class BeamState:
    """Running beams, finished hypotheses and stopping flags of transformers' beam search (5.x).

    :meth:`step` is a line-by-line port of one iteration of ``GenerationMixin._beam_search`` for one
    batch item (top-K continuations, running beams, finished beams, early-stopping heuristic), float
    operations in the same order so that scores and ties come out bit for bit the same.
    """

    def __init__(self, num_beams: int, max_new_tokens: int, eos: torch.Tensor, length_penalty: float,
                 early_stopping: bool | str):
        w, n = num_beams, max_new_tokens
        self.w, self.n, self.eos = w, n, eos
        dev = eos.device  # everything lives where the target runs
        self.length_penalty, self.early_stopping = length_penalty, early_stopping
        self.keep = max(2, 1 + eos.numel()) * w  # candidates per step: enough that w survive any EOS
        self.top_mask = torch.arange(self.keep, device=dev) < w  # [K]: only the best w candidates may finish
        self.run_tokens = torch.full((w, n), -1, dtype=torch.long, device=dev)  # [w, N] generated tokens
        self.run_scores = torch.zeros(w, device=dev)  # [w] summed log-probabilities
        self.run_scores[1:] = NEG  # the w initial beams are one prompt: only the first one expands
        self.fin_tokens = torch.full((w, n), -1, dtype=torch.long, device=dev)  # [w, N]
        self.fin_scores = torch.full((w,), NEG, device=dev)  # [w] length-penalised
        self.fin_lengths = torch.zeros(w, dtype=torch.long, device=dev)  # [w]
        self.fin_done = torch.zeros(w, dtype=torch.bool, device=dev)  # [w] slot holds a real hypothesis
        self.improvable = torch.tensor(True, device=dev)  # transformers' is_early_stop_heuristic_unsatisfied
        self.cur = 0  # tokens generated so far by every running beam
        self.done = False

    def running(self, prompt: torch.Tensor) -> torch.Tensor:
        """The running beams as whole sequences [w, P + cur]."""
        return torch.cat([prompt.expand(self.w, -1), self.run_tokens[:, : self.cur]], dim=1)

    def step(self, log_probs: torch.Tensor) -> torch.Tensor:
        """One beam step. log_probs: [w, V] float32 log-softmax of p for each running beam, in order.

        Returns parents [w]: for each new running beam, the index of the running beam it extends.
        """
        w, vocab = log_probs.shape
        lp, es = self.length_penalty, self.early_stopping
        # top-K continuations
        accumulated = (log_probs + self.run_scores[:, None]).reshape(-1)  # [w * V]
        top_scores, top_index = torch.topk(accumulated, k=self.keep)  # [K], [K]
        parent = top_index // vocab
        token = top_index % vocab
        top_tokens = self.run_tokens[parent]  # [K, N] (a copy)
        top_tokens[:, self.cur] = token
        hits = torch.isin(token, self.eos) | (self.cur + 1 >= self.n)  # [K] EOS or max length
        # running beams for the next step: the best w that did not just finish
        running_scores = top_scores + hits.to(torch.float32) * NEG
        nxt = torch.topk(running_scores, k=w)[1]  # [w]
        self.run_tokens, self.run_scores, parents = top_tokens[nxt], running_scores[nxt], parent[nxt]
        # finished hypotheses: merge the just-finished among the best w, keep the best w overall
        just = hits & self.top_mask  # [K]
        scores = top_scores / ((self.cur + 1) ** lp)
        scores += (self.fin_done.all() & (es is True)).to(torch.float32) * NEG
        scores += (~self.improvable).to(torch.float32) * NEG
        scores += (~just) * NEG
        merged = torch.topk(torch.cat([self.fin_scores, scores]), k=w)[1]  # [w]
        self.fin_tokens = torch.cat([self.fin_tokens, top_tokens])[merged]
        self.fin_scores = torch.cat([self.fin_scores, scores])[merged]
        self.fin_lengths = torch.cat([self.fin_lengths, torch.full((self.keep,), self.cur + 1, device=self.eos.device)])[merged]
        self.fin_done = torch.cat([self.fin_done, just])[merged]
        self.cur += 1
        # early stopping heuristic: can the best running beam still beat the worst finished one?
        best_length = self.n if (es == "never" and lp > 0.0) else self.cur
        best_possible = self.run_scores[:1] / (best_length ** lp)  # [1]
        worst_finished = torch.where(self.fin_done, torch.min(self.fin_scores), NEG)  # [w]
        self.improvable = self.improvable & torch.any(best_possible > worst_finished)
        open_beam = not (bool(self.fin_done.all()) and es is True)
        self.done = not (bool(self.improvable) and open_beam and not bool(hits.all()))
        return parents

    def best(self) -> tuple[list[int], float]:
        return self.fin_tokens[0, : int(self.fin_lengths[0])].tolist(), float(self.fin_scores[0])

