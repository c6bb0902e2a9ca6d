"""Beam search with the target alone, speculative beam search (paper Appendix A.4), and the
student report's approximate variant (its Algorithm 2).

Notation as everywhere in specdec: p is the target M_p, q the draft M_q, gamma the number of draft
steps, w the beam width (``num_beams``), u >= w the draft's beam width (``draft_beams``).

Vocabulary:

- a *beam step* is one step of transformers' beam search: every running beam is extended by every
  token, the best 2w (more with several EOS ids) candidates by summed log-probability are kept, those
  ending in EOS (and among the best w) become *finished hypotheses* scored sum_logprobs /
  length ** length_penalty (length = generated tokens, EOS included), and the best w that did not end
  become the running beams of the next step;
- the *draft tree* of a round: level 0 is the w running beams, level k the u sequences the draft's own
  beam search keeps after k steps (EOS continuations excluded: a finished beam needs no logits);
- a *round* (exact mode) is one target forward pass over every root-to-node path of the tree, then as
  many target beam steps as the tree has logits for: a level-k beam step needs p for each of the
  target's running beams, which the pass holds when they are all nodes of level k;
- *accepted steps*: beam steps taken from the tree's levels 1..gamma (the step from level 0 uses the
  running beams, which the target needs anyway); like speculative decoding, a round yields
  accepted + 1 beam steps.

The acceptance rule (exact mode). After the target's own beam step from level k, let R be the w
running beams it selected, each a (parent beam, token) pair. The step is followed by another one
from the same pass iff every sequence of R is a node the draft kept at level k + 1 (same parent node,
same token). Then p for R is in the pass, and the next step is computed from exactly the logits plain
beam search would compute for exactly the same sequences; by induction every state (running beams,
scores, finished hypotheses, stopping flags) equals plain beam search's, so the output is identical,
whatever the draft. The draft's scores never enter a decision, only which sequences get scored.
Finished hypotheses need no logits, so an EOS candidate never has to be in the tree. This is the
paper's top_w(M_p) subset of top_u(M_q), made precise.

Identity is exact in the arithmetic of the beam step; the logits themselves come from passes of
different shapes (one token per beam vs. gamma + 1 tokens per path), which in floating point can
differ in the last bits, as in any speculative decoder. A near-tie at that level could be resolved
differently; tests in fp32 see none.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specdec.acceptance import speculative_sampling
from specdec.devices import Stopwatch, new_generator
from specdec.drafters.model import fit_width
from specdec.errors import SpecDecError
from specdec.models import LanguageModel, check_same_vocabulary
from specdec.sampling import SamplingParams, sample, standardize

MODES = ("exact", "report")
_NEG = -1.0e9  # transformers' "never choose this" score offset, reproduced bit for bit


@dataclass
class BeamOutput:
    token_ids: list[int]  # the best hypothesis' generated tokens (EOS included when it ended with EOS)
    score: float  # its score: sum of log-probabilities / length ** length_penalty
    stats: dict[str, Any] = field(default_factory=dict)


# -- a batched KV cache, used functionally ------------------------------------------------------


def _fork(cache: DynamicCache, rows: torch.Tensor) -> DynamicCache:
    """A new cache holding ``rows`` [B] of ``cache``; ``cache`` itself is left unchanged."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    new.batch_select_indices(rows)  # advanced indexing: the new layers own new tensors
    return new


class _BatchKV:
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

    def forward(self, seqs: torch.Tensor, n_logits: int) -> tuple["_BatchKV", torch.Tensor]:
        """Logits [B, n_logits, V] for the last n_logits positions of seqs [B, L], and the cache of seqs."""
        rows, keep = self.reuse(seqs, n_logits)
        cache = _fork(self.cache, rows)
        drop = self.tokens.shape[1] - keep
        if drop > 0:
            cache.crop(-drop)
        logits = self.model.hf_model(
            input_ids=seqs[:, keep:], past_key_values=cache, use_cache=True, logits_to_keep=n_logits
        ).logits
        fed = seqs.shape[0] * (seqs.shape[1] - keep)
        return _BatchKV(self.model, cache, seqs.clone(), fed), logits[:, -n_logits:]


def _best_snapshot(snapshots: list[_BatchKV], seqs: torch.Tensor) -> _BatchKV:
    """The snapshot that needs the fewest new positions fed to reach seqs (the latest among equals)."""
    keeps = [kv.reuse(seqs, 1)[1] for kv in snapshots]
    return snapshots[max(range(len(keeps)), key=lambda i: (keeps[i], i))]


# -- the beam search state: transformers' _beam_search, one batch item --------------------------


class _BeamState:
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
        self.run_scores[1:] = _NEG  # the w initial beams are one prompt: only the first one expands
        self.fin_tokens = torch.full((w, n), -1, dtype=torch.long, device=dev)  # [w, N]
        self.fin_scores = torch.full((w,), _NEG, device=dev)  # [w] length-penalised
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
        running_scores = top_scores + hits.to(torch.float32) * _NEG
        nxt = torch.topk(running_scores, k=w)[1]  # [w]
        self.run_tokens, self.run_scores, parents = top_tokens[nxt], running_scores[nxt], parent[nxt]
        # finished hypotheses: merge the just-finished among the best w, keep the best w overall
        just = hits & self.top_mask  # [K]
        scores = top_scores / ((self.cur + 1) ** lp)
        scores += (self.fin_done.all() & (es is True)).to(torch.float32) * _NEG
        scores += (~self.improvable).to(torch.float32) * _NEG
        scores += (~just) * _NEG
        merged = torch.topk(torch.cat([self.fin_scores, scores]), k=w)[1]  # [w]
        self.fin_tokens = torch.cat([self.fin_tokens, top_tokens])[merged]
        self.fin_scores = torch.cat([self.fin_scores, scores])[merged]
        self.fin_lengths = torch.cat([self.fin_lengths, torch.full((self.keep,), self.cur + 1, device=self.eos.device)])[merged]
        self.fin_done = torch.cat([self.fin_done, just])[merged]
        self.cur += 1
        # early stopping heuristic: can the best running beam still beat the worst finished one?
        best_length = self.n if (es == "never" and lp > 0.0) else self.cur
        best_possible = self.run_scores[:1] / (best_length ** lp)  # [1]
        worst_finished = torch.where(self.fin_done, torch.min(self.fin_scores), _NEG)  # [w]
        self.improvable = self.improvable & torch.any(best_possible > worst_finished)
        open_beam = not (bool(self.fin_done.all()) and es is True)
        self.done = not (bool(self.improvable) and open_beam and not bool(hits.all()))
        return parents

    def best(self) -> tuple[list[int], float]:
        return self.fin_tokens[0, : int(self.fin_lengths[0])].tolist(), float(self.fin_scores[0])


# -- drafts for the exact mode: log q for every node of a tree level -----------------------------


class _ModelDraft:
    """A draft model running batched beam search with its own KV cache (snapshots per tree level)."""

    def __init__(self, model: LanguageModel, vocab_size: int):
        self.model, self.vocab_size = model, vocab_size
        self.kv = _BatchKV(model)
        self.snapshots: list[_BatchKV] = []
        self.calls = 0

    def start(self, prompt: torch.Tensor) -> None:
        self.kv, _ = self.kv.forward(prompt[None], 1)
        self.calls += 1

    def begin_round(self) -> None:
        self.snapshots = [self.kv]

    def log_q(self, seqs: torch.Tensor) -> torch.Tensor:
        """seqs [n, L] -> log q [n, V] of the next token."""
        kv, logits = _best_snapshot(self.snapshots, seqs).forward(seqs, 1)
        self.snapshots.append(kv)
        self.calls += 1
        return F.log_softmax(fit_width(logits[:, -1].float(), self.vocab_size), dim=-1)

    def end_round(self, running: torch.Tensor) -> None:
        # The new running beams extend nodes of the tree: keep the snapshot that holds the most of them.
        self.kv = _best_snapshot(self.snapshots, running)
        self.snapshots = []


class _ProbabilityDraft:
    """A parameter-free drafter with probabilities (n-gram, random, ...): q from its ``propose``.

    The drafter sees temperature 1, so the q it returns is its full distribution. An
    :class:`~specdec.drafters.NGramDrafter` is read through its counts instead (``counts_after``,
    ``unigram``, see :meth:`_ngram_q`), so that querying tree nodes does not teach it draft tokens; it
    learns from the leading running beam once per round.
    """

    BACKOFF = 0.1

    def __init__(self, drafter: Any, vocab_size: int, eos: set[int], generator: torch.Generator,
                 device: torch.device):
        from specdec.drafters import DraftContext, NGramDrafter

        self.drafter, self.vocab_size, self.generator = drafter, vocab_size, generator
        self.is_ngram = isinstance(drafter, NGramDrafter)
        self.eos = frozenset(eos)
        self.device = device
        self._context = DraftContext
        self.calls = 0

    @property
    def _passes(self) -> int:
        return int(getattr(self.drafter, "forward_passes", 0) or 0)

    def start(self, prompt: torch.Tensor) -> None:
        sampling = SamplingParams(temperature=1.0)  # q is then the drafter's full distribution
        self.drafter.start(self._context(prompt.tolist(), sampling, self.generator, self.vocab_size, self.eos,
                                         device=self.device))

    def begin_round(self) -> None:
        return None

    def _normalised(self, counts: dict[int, int]) -> torch.Tensor | None:
        if not counts:
            return None
        q = torch.zeros(self.vocab_size, device=self.device)
        ids = torch.tensor(list(counts.keys()), dtype=torch.long, device=self.device)
        q[ids] = torch.tensor(list(counts.values()), dtype=torch.float32, device=self.device)
        return q / q.sum()

    def _ngram_q(self, previous: int) -> torch.Tensor:
        """The n-gram's q, with the bigram interpolated with the unigram (weight BACKOFF).

        A bigram seen once has a single successor; a beam of width u needs u candidates, and the
        unigram ranks the rest instead of leaving them to chance. Exactness does not depend on q.
        """
        d = self.drafter
        unigram = self._normalised(dict(d.unigram))
        bigram = self._normalised(d.counts_after(previous)) if d.order == 2 else None
        if bigram is None and unigram is None:
            return self._uniform()
        if bigram is None or unigram is None:
            return bigram if unigram is None else unigram
        return (1.0 - self.BACKOFF) * bigram + self.BACKOFF * unigram

    def _uniform(self) -> torch.Tensor:
        return torch.full((self.vocab_size,), 1.0 / self.vocab_size, device=self.device)

    def log_q(self, seqs: torch.Tensor) -> torch.Tensor:
        rows = []
        for seq in seqs.tolist():
            if self.is_ngram:
                rows.append(self._ngram_q(seq[-1]))
                continue
            before = self._passes
            draft = self.drafter.propose(seq, 1)
            self.calls += self._passes - before
            if draft.q is None:
                raise SpecDecError(
                    f"the draft {getattr(self.drafter, 'name', self.drafter)!r} gives no probabilities, which exact "
                    "speculative beam search needs; use a model, 'bigram' or 'unigram' (or beam_mode='report')"
                )
            rows.append(draft.q[0] if len(draft) else self._uniform())
        return torch.stack(rows).clamp_min(0.0).log()  # [n, V]

    def end_round(self, running: torch.Tensor) -> None:
        if self.is_ngram:  # learn from the leading running beam's new tokens
            self.drafter.propose(running[0].tolist(), 1)


def _make_draft(draft: Any, target: LanguageModel, mode: str):
    """Normalise ``draft`` into (kind, object): ("model", LanguageModel) or ("drafter", Drafter)."""
    from specdec.drafters import ModelDrafter, PromptLookupDrafter, make_drafter

    if draft is None:
        return None, None
    if isinstance(draft, LanguageModel):
        model = draft
    elif isinstance(draft, ModelDrafter):
        model = draft.model
    else:
        drafter = make_drafter(draft, target)
        if isinstance(drafter, ModelDrafter):
            model = drafter.model
        else:
            if mode == "exact" and isinstance(drafter, PromptLookupDrafter):
                raise SpecDecError(
                    "prompt lookup gives no probabilities, which exact speculative beam search needs to run the "
                    "draft's own beam search; use a draft model, 'bigram' or 'unigram' (or beam_mode='report')"
                )
            return "drafter", drafter
    if model.is_encoder_decoder:
        raise SpecDecError("beam search supports decoder-only models; the draft is an encoder-decoder model")
    check_same_vocabulary(target, model)
    return "model", model


# -- the public function --------------------------------------------------------------------------


def _validate(num_beams, draft_beams, gamma, mode, max_new_tokens, length_penalty, early_stopping) -> None:
    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not is_int(num_beams) or num_beams < 1:
        raise SpecDecError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if draft_beams is not None and (not is_int(draft_beams) or draft_beams < num_beams):
        raise SpecDecError(
            f"draft_beams (the draft's beam width u) must be an integer >= num_beams ({num_beams}), got {draft_beams!r}"
        )
    if not is_int(gamma) or gamma < 1:
        raise SpecDecError(f"gamma must be an integer >= 1, got {gamma!r}")
    if mode not in MODES:
        raise SpecDecError(
            f"unknown beam mode {mode!r}; use 'exact' (paper Appendix A.4, identical to plain beam search) or "
            "'report' (the report's Algorithm 2, approximate)"
        )
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise SpecDecError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or math.isnan(length_penalty):
        raise SpecDecError(f"length_penalty must be a number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never"):
        raise SpecDecError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")


def beam_search(
    target: LanguageModel,
    prompt_ids: Sequence[int],
    *,
    num_beams: int,
    max_new_tokens: int,
    draft: Any = None,
    draft_beams: int | None = None,
    gamma: int = 3,
    mode: str = "exact",
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_ids: set[int] | None = None,
    seed: int | None = None,
) -> BeamOutput:
    """Beam search of width ``num_beams`` with the target, speculatively when ``draft`` is given.

    target: a decoder-only :class:`LanguageModel`; prompt_ids: the prompt's token ids.
    draft: None (plain beam search), a model, a :class:`~specdec.drafters.ModelDrafter`, or a drafter
      that gives probabilities (``"bigram"``, ``"unigram"``, an :class:`~specdec.drafters.NGramDrafter`).
    draft_beams: u >= num_beams, the draft's beam width (default num_beams); gamma: draft steps per round.
    mode: ``"exact"``: the output equals plain beam search token for token (paper Appendix A.4, see the
      module docstring); ``"report"``: the report's Algorithm 2, approximate (``stats["exact"]`` False).
    length_penalty, early_stopping: as in transformers' ``generate``.
    eos_token_ids: default the target's. seed: the random source of report mode (and of drafters).

    Plain and exact modes equal transformers' ``generate(num_beams=w, do_sample=False, ...)``.
    """
    _validate(num_beams, draft_beams, gamma, mode, max_new_tokens, length_penalty, early_stopping)
    if target.is_encoder_decoder:
        raise SpecDecError("beam search supports decoder-only targets; this target is an encoder-decoder model")
    device = target.device
    prompt = torch.tensor([int(t) for t in prompt_ids], dtype=torch.long, device=device)  # [P]
    if prompt.numel() == 0:
        raise SpecDecError("the prompt is empty (no tokens); give some text to continue")
    eos = set(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
    limit = max_new_tokens
    if target.max_context is not None:
        limit = min(limit, target.max_context - prompt.numel())
        if limit < 1:
            raise SpecDecError(
                f"the prompt has {prompt.numel()} tokens but {target.name} reads at most {target.max_context}; "
                "shorten the prompt"
            )
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    generator = new_generator(device, seed)
    clock = Stopwatch(device)
    kind, draft_obj = _make_draft(draft, target, mode)

    stats: dict[str, Any] = {
        "mode": "plain" if kind is None and mode == "exact" else mode,
        "exact": mode == "exact",
        "num_beams": num_beams,
        "draft_beams": (draft_beams or num_beams) if kind is not None and mode == "exact" else None,
        "gamma": gamma if kind is not None else None,
        "prompt_tokens": int(prompt.numel()),
        "target_calls": 0,  # serial target forward passes, the prefill included
        "draft_calls": 0,  # forward passes of a draft model (0 for parameter-free drafts)
        "target_positions": 0,  # positions the target computed (batch x length summed): its total work
        "steps": 0,  # beam steps (tokens added to the running beams)
        "rounds": 0,  # speculative passes (exact mode) / beam iterations (report mode)
        "time_draft_s": 0.0,
        "time_target_s": 0.0,
        "seed": seed,
    }
    exact = mode == "exact"
    stats["drafted_steps"] = 0 if exact else None  # exact: tree levels 1..gamma offered by the draft
    stats["accepted_steps"] = 0 if exact else None  # exact: beam steps computed from those levels
    stats["drafted_tokens"] = None if exact else 0  # report: tokens drafted over all sampling chains
    stats["accepted_tokens"] = None if exact else 0  # report: of which accepted
    t_start = clock()
    with torch.inference_mode():
        if mode == "report":
            tokens, score = _report_beam_search(
                target, prompt, num_beams, limit, kind, draft_obj, gamma, length_penalty, eos, generator, stats, clock
            )
        else:
            tokens, score = _exact_beam_search(
                target, prompt, num_beams, draft_beams or num_beams, limit, kind, draft_obj, gamma,
                length_penalty, early_stopping, eos, generator, stats, clock,
            )
    stats["time_total_s"] = clock() - t_start
    stats["new_tokens"] = len(tokens)
    drafted, accepted = ("drafted_steps", "accepted_steps") if exact else ("drafted_tokens", "accepted_tokens")
    stats["acceptance_rate"] = stats[accepted] / stats[drafted] if stats[drafted] else None
    stats["steps_per_target_call"] = stats["steps"] / stats["target_calls"] if stats["target_calls"] else None
    if tokens and tokens[-1] in eos:
        stats["stop_reason"] = "eos"
    else:
        stats["stop_reason"] = "max_new_tokens" if len(tokens) >= max_new_tokens else "context"
    return BeamOutput(tokens, score, stats)


def _exact_beam_search(target, prompt, w, u, limit, kind, draft_obj, gamma, length_penalty, early_stopping,
                       eos, generator, stats, clock) -> tuple[list[int], float]:
    vocab = target.vocab_size
    eos_t = torch.tensor(sorted(eos), dtype=torch.long, device=prompt.device)
    state = _BeamState(w, limit, eos_t, length_penalty, early_stopping)

    def target_forward(kv: _BatchKV, seqs: torch.Tensor, n_logits: int):
        t0 = clock()
        kv, logits = kv.forward(seqs, n_logits)
        stats["time_target_s"] += clock() - t0
        stats["target_calls"] += 1
        stats["target_positions"] += kv.fed
        return kv, logits.float()

    # Prefill the prompt once (batch 1); its logits are the first step's for all w (identical) beams.
    tkv, logits = target_forward(_BatchKV(target), prompt[None], 1)
    state.step(F.log_softmax(logits[:, -1], dim=-1).expand(w, -1))

    draft = None
    if kind is not None:
        if kind == "model":
            draft = _ModelDraft(draft_obj, vocab)
        else:
            draft = _ProbabilityDraft(draft_obj, vocab, eos, generator, prompt.device)
        t0 = clock()
        draft.start(prompt)  # a draft model prefills the prompt once too
        stats["time_draft_s"] += clock() - t0
        stats["draft_calls"] += draft.calls

    while not state.done:
        g = min(gamma, state.n - state.cur - 1) if draft is not None else 0
        roots = state.running(prompt)  # [w, L]
        if g <= 0:  # plain beam step
            tkv, logits = target_forward(tkv, roots, 1)
            state.step(F.log_softmax(logits[:, -1], dim=-1))
            continue
        # 1. the draft's own beam search of width u for g steps, from the target's running beams
        t0 = clock()
        draft.begin_round()
        calls_before = draft.calls
        levels = _draft_tree(draft, roots, state.run_scores.clone(), u, g, eos_t, vocab)
        stats["draft_calls"] += draft.calls - calls_before
        stats["time_draft_s"] += clock() - t0
        # 2. one target pass over every root-to-leaf path of the tree
        paths, where = _tree_paths(roots, levels)
        tkv, logits = target_forward(tkv, paths, g + 1)  # [B, g + 1, V]
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


# -- the report's Algorithm 2 (approximate) -------------------------------------------------------


@dataclass
class _Hypothesis:
    tokens: list[int]  # generated tokens
    score: float  # summed log-probability under the target
    ended: bool
    tkv: _BatchKV
    dkv: _BatchKV | None


def _report_beam_search(target, prompt, k, limit, kind, draft_obj, gamma, length_penalty, eos, generator,
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
    tkv0 = _prefill(target, prompt[:-1])
    stats["time_target_s"] += clock() - t0
    stats["target_calls"] += int(tkv0.fed > 0)
    stats["target_positions"] += tkv0.fed
    dkv0 = None
    if kind == "model":
        dkv0 = _prefill(draft_obj, prompt[:-1])
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
            tkv, logits = beam.tkv.forward(chains, g + 1)  # [k, g + 1, V]
            stats["time_target_s"] += clock() - t0
            stats["target_calls"] += 1
            stats["target_positions"] += tkv.fed
            p = standardize(logits, sampling)  # [k, g + 1, V]
            # 3. speculative sampling on each chain; score by the target's log-probabilities
            for c in range(k):
                drafted = chains[c, seq.numel():]
                out, n = speculative_sampling(p[c], None if q is None else q[c], drafted, generator)
                stats["drafted_tokens"] += g
                stats["accepted_tokens"] += n
                new = out.tolist()
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


def _prefill(model: LanguageModel, ids: torch.Tensor) -> _BatchKV:
    """The cache of ids [n] (batch 1); an empty cache when n is 0."""
    return _BatchKV(model).forward(ids[None], 1)[0] if ids.numel() else _BatchKV(model)


def _sample_chains(kind, model, drafter, dkv, seq, k, g, vocab, generator, stats):
    """k chains seq + x_1..x_g, x_i ~ q_i. Returns chains [k, L + g'], q [k, g', V] or None, the draft's cache."""
    chains = seq.expand(k, -1).clone()  # [k, L]
    if g <= 0 or kind is None:
        return chains, None, dkv
    if kind == "model":
        qs = []
        for _ in range(g):
            dkv, logits = dkv.forward(chains, 1)
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
