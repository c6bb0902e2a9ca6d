"""A speculative round as one captured computation: a model draft's gamma steps, the target's pass and the
acceptance replayed together (one CUDA graph on a GPU), and plain decoding's step with its sampling.

The per-step path (:func:`specdec.rounds.speculative_round`) replays one graph per model step and runs the
sampling and the acceptance eagerly, with Python between them. A :class:`RoundGraph` is the whole round as
one function of static buffers:

    tail [2]: the sequence's last two tokens;  start [1]: its length L;  seed [1]
      draft:      one 2-token step over tail at L-2, L-1, then gamma - 1 one-token steps; x_i drawn from q_i
      target:     one pass over [tail[1], x_1 .. x_gamma] at L-1 .. L-1+gamma (padded to its width bucket)
      acceptance: :func:`specdec.acceptance.verify` (greedy, or speculative sampling: residual, bonus token)
      out [3 gamma + 2] float64: n, the round's tokens [gamma + 1], the betas [gamma], the drafts [gamma]

and the host reads ``out`` once. Prompt lookup (its default n-grams, greedy) is searched inside the graph
(:func:`device_lookup`, over a device copy of the sequence that each round extends), so its rounds need
nothing from the host either. The round also leaves the next round's tail and start in its inputs, so with a
constant gamma the next round of a model draft, prompt lookup or plain decoding is launched
(:meth:`RoundGraph.replay_chained`) before this one is read: the
device never waits for the host between rounds (``out`` goes to one of two slots, copied to pinned host memory
without blocking, and the read waits for that copy alone). A generation that ends at a round leaves the round
launched after it unused. Any other drafter (prompt lookup with other n-grams, n-gram models, a hierarchy,
another tokenizer)
proposes on its own, and at temperature 0 its proposal is verified in a graph of the same form that takes the
drafts as an input (``given``: [gamma] ids, -1 past the proposal, never equal to the target's choice). Random numbers come from :class:`~specdec.counter_random.PositionalRandom`
keyed by the seed and L, so a replay draws what an eager run of the same function draws. gamma = 0 with no
draft is plain decoding's step, its sampling included.

The draft's first step always feeds the last two tokens (the per-step drafter feeds one or two, whichever its
cache lacks), so one graph serves every round, and the draft's cache is rolled back to L' - 2 after each.
Re-feeding a cached token rewrites its key and value with what a 2-token pass computes: the drafts may differ
in the last bits from the per-step path's, the output never does (it is verified).

The graphs are captured by :func:`specdec.capture_plan.prepare_rounds` (from :func:`specdec.capture_plan.prepare_steps`), one per
(draft cache, gamma, sampling), kept on the target's cache and captured into the target's graph pool; a
generation only replays them. With CUDA graphs the prefill leaves the prompt's last token to the first round,
so that round is a captured one too, and a round the budget cuts short replays the graph of the schedule's
gamma (its tokens past the budget dropped) when none of the shorter gamma was captured. A round outside that
plan runs step by step as before: a gamma or a sampling not captured, lenience, sampled block verification, the adaptive and confidence schedules (they read per-phase times or
stop the draft on the host), and every drafter but a model draft when sampling (its q would be an input too).
``GenerationStats.rounds_graphed`` and ``rounds_per_step`` count both. A model draft's graphed round is timed
as one: its time counts as the target's (``time_target``), none of it as drafting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from specdec.acceptance import Verification, verify
from specdec.counter_random import MASK32, PositionalRandom
from specdec.drafters.base import Draft
from specdec.drafters.model import ModelDrafter, draft_token
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.models.sessions import graphs
from specdec.models.sessions.graphs import WARMUP_RUNS, bucket_for
from specdec.rounds import Round
from specdec.sampling import SamplingParams

if TYPE_CHECKING:
    from specdec.models.causal import LanguageModel
    from specdec.models.cache.static_cache import StaticKVCache

GRAPHED_SCHEDULES = ("constant", "heuristic")  # they choose gamma from acceptances alone, not from phase times
GIVEN = "given"  # the plan's name for rounds whose drafts come from outside the graph (any drafter, greedy)
GREEDY = SamplingParams()


class RoundGraph:
    """One round of ``draft`` (None: a plain step, gamma 0) at ``gamma`` under ``sampling``, on two static caches."""

    def __init__(self, target: "LanguageModel", target_cache: "StaticKVCache", draft: "LanguageModel | None",
                 draft_cache: "StaticKVCache | None", gamma: int, sampling: SamplingParams, given: bool = False,
                 lookup: tuple[int, int] | None = None):
        if (given or lookup) and (draft is not None or not sampling.greedy or gamma == 0):
            raise ValueError("a round graph of given or looked-up drafts verifies gamma >= 1 ids at temperature 0, "
                             "without a model")
        if given and lookup:
            raise ValueError("a round graph's drafts are given or looked up, not both")
        if not (given or lookup) and (draft is None) != (gamma == 0):
            raise ValueError("a round graph drafts gamma >= 1 tokens with a draft model, or is a plain step (gamma 0)")
        self.width = bucket_for(gamma + 1)  # the target's pass, padded to its bucket (the per-step graphs' shapes)
        if self.width is None:
            raise ValueError(f"gamma {gamma} verifies {gamma + 1} tokens, wider than the widest graph")
        device = target_cache.device
        self.target, self.target_cache, self.draft, self.draft_cache = target, target_cache, draft, draft_cache
        self.gamma, self.sampling, self.given, self.lookup = gamma, sampling, given, lookup
        # lookup: the sequence on the device, [C] static (set from the loop's ids at a launch from the host, then
        # extended by each round with its tokens), and prompt lookup's (max_ngram, min_ngram) run on it
        self.sequence = torch.zeros(target_cache.capacity if lookup else 0, dtype=torch.long, device=device)
        self._written = torch.arange(gamma + 1, device=device)  # [gamma + 1] a round's positions past L
        self.drafts = torch.full((gamma,), -1, dtype=torch.long, device=device)  # [gamma] static input when given
        self.tail = torch.zeros(1, 2, dtype=torch.long, device=device)  # [1, 2] static input: the last two tokens
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # [1] static input: the sequence length L
        self.seed = torch.zeros(1, dtype=torch.long, device=device)  # [1] static input
        self.draft_ids = torch.zeros(1, 1, dtype=torch.long, device=device)  # [1, 1] the drafted token fed back
        self.target_ids = torch.zeros(1, self.width, dtype=torch.long, device=device)  # [1, w] the verified tokens
        self._next = torch.tensor([1, 2], device=device)  # [2] where the next tail sits in [tail, round's tokens]
        self.graph: Any = None
        self.out: torch.Tensor | None = None  # [3 gamma + 2] float64, rewritten by every replay
        self.slots = (_Slot(3 * gamma + 2, device), _Slot(3 * gamma + 2, device))  # replays' outputs, alternately
        self._slot = 0

    @torch.inference_mode()
    def run(self) -> torch.Tensor:
        """The round, computed from the static inputs (what the graph captures): out [3 gamma + 2] float64."""
        gamma, sampling, vocab = self.gamma, self.sampling, self.target.vocab_size
        rng = PositionalRandom(self.seed, self.start)
        drafts: list[torch.Tensor] = []  # [1] long each
        qs: list[torch.Tensor] = []  # [V] each (sampling)
        if self.given:
            drafts = [self.drafts]
        elif self.lookup:
            drafts = [device_lookup(self.sequence, self.start, gamma, *self.lookup)]
        elif gamma:
            draft = self.draft
            logits = draft.step_function(draft.hf_model, self.draft_cache, self.tail, self.start - 2)[-1]  # [V']
            for i in range(1, gamma + 1):
                x, q = draft_token(logits, vocab, sampling, rng, None)  # x_i, at position L - 1 + i
                drafts.append(x.reshape(1))
                if q is not None:
                    qs.append(q)
                if i < gamma:
                    self.draft_ids.copy_(x.reshape(1, 1))
                    logits = draft.step_function(draft.hf_model, self.draft_cache, self.draft_ids, self.start - 1 + i)[0]
        tokens = torch.cat([self.tail[0, 1:], *drafts])  # [gamma + 1]
        # the rest is padding (and a given proposal's -1s are fed as 0): stale entries past what is accepted
        self.target_ids[0, : gamma + 1].copy_(tokens.clamp_min(0))
        logits = self.target.step_function(self.target.hf_model, self.target_cache, self.target_ids, self.start - 1)
        drafted = tokens[1:]  # [gamma]
        result = verify(logits[: gamma + 1], drafted, torch.stack(qs) if qs else None, sampling, rng)
        out = torch.cat([result.n.reshape(1).double(), result.tokens.double(), result.betas.double(), drafted.double()])
        # the next round's inputs, left for a replay launched before this one is read (chained): the sequence's
        # last two tokens and its length after this round, L + n + 1 (a replay after set_inputs overwrites them)
        n = result.n.reshape(1).long()  # [1]
        sequence = torch.cat([self.tail[0], result.tokens])  # [gamma + 3]: positions L - 2 .. L + gamma
        self.tail[0].copy_(sequence.index_select(0, n + self._next))
        if self.lookup:  # the round's tokens at L .. L + gamma (those past L + n are overwritten by later rounds)
            self.sequence.index_copy_(0, self.start + self._written, result.tokens.long())
        self.start.add_(n + 1)
        return out

    def capture(self, pool: Any) -> None:
        """Warm up (on a side stream, at positions 0 .. gamma + width), then capture :meth:`run` into ``pool``."""
        with graphs.side_stream():
            for _ in range(WARMUP_RUNS):
                self.start.fill_(2)  # (each run advances it, as a chained replay would)
                self.run()
        self.start.fill_(2)
        self.graph, self.out = graphs.capture(self.run, pool)

    def replay(self, ids: torch.Tensor, length: int, seed: int, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the round after ``ids[:length]`` (the sequence on the device; ``drafts`` [g <= gamma] when given);
        ``out``, valid until the next replay."""
        self.set_inputs(ids, length, seed, drafts)
        with torch.inference_mode():
            self.graph.replay()
        return self.out

    def replay_chained(self) -> torch.Tensor:
        """Replay the round that follows the last one replayed, on the inputs that one left on the device (no
        host input: it can be launched before the last one is read); ``out``, valid until the next replay."""
        with torch.inference_mode():
            self.graph.replay()
        return self.out

    def stash(self, out: torch.Tensor) -> "_Slot":
        """Copy a replay's ``out`` into the next of two slots (on the device, then to the host without waiting),
        so the next replay can be launched before this one is read."""
        slot = self.slots[self._slot]
        self._slot ^= 1
        slot.fill(out)
        return slot

    def set_inputs(self, ids: torch.Tensor, length: int, seed: int, drafts: torch.Tensor | None = None) -> None:
        """Fill the static inputs (device copies and fills: no host sync)."""
        if drafts is not None:
            self.drafts[: drafts.shape[0]].copy_(drafts)
            self.drafts[drafts.shape[0]:].fill_(-1)
        self.tail[0].copy_(ids[length - 2: length])
        if self.lookup:
            size = min(ids.shape[0], self.sequence.shape[0])
            self.sequence[:size].copy_(ids[:size])
        self.start.fill_(length)
        self.seed.fill_(seed & MASK32)


class _Slot:
    """One replay's output: a device copy (what the loop's device views read) and a host copy (pinned on CUDA,
    written by a copy that does not block); :meth:`read` waits for that copy alone, not for a later replay."""

    def __init__(self, size: int, device: torch.device):
        self.device = torch.zeros(size, dtype=torch.float64, device=device)  # [3 gamma + 2]
        on_cuda = device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.float64, pin_memory=True) if on_cuda else self.device
        self.event = torch.cuda.Event() if on_cuda else None

    def fill(self, out: torch.Tensor) -> None:
        self.device.copy_(out)
        if self.event is not None:
            self.host.copy_(self.device, non_blocking=True)
            self.event.record()

    def read(self) -> list[float]:
        """The round's values on the host: its one synchronization."""
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


def device_lookup(sequence: torch.Tensor, length: torch.Tensor, k: int, max_ngram: int, min_ngram: int) -> torch.Tensor:
    """Prompt lookup on the device, for a captured round: what :func:`~specdec.drafters.find_continuation` proposes
    for ``sequence[:length]`` (the last n tokens' most recent earlier occurrence, n = max_ngram down to min_ngram;
    up to k tokens that followed it), as [k] long padded with -1, with no host read.

    sequence: [C] long (entries from ``length`` on are ignored); length: [1] long."""
    capacity = sequence.shape[0]
    index = torch.arange(capacity, device=sequence.device)  # [C] where a window starts
    start = torch.full_like(length, -1)  # [1] where the continuation starts (-1: no match yet)
    for n in range(max_ngram, min_ngram - 1, -1):  # the longest suffix that matches wins
        match = index + n <= length - 1  # [C] windows that end before the last token
        for j in range(n):
            suffix = sequence[(length - n + j).clamp_min(0)]  # [1] the suffix's j-th token
            match &= sequence[(index + j).clamp_max(capacity - 1)] == suffix
        last = torch.where(match, index, -1).amax().reshape(1)  # [1] the most recent occurrence, or -1
        start = torch.where((start < 0) & (last >= 0), last + n, start)
    positions = start + torch.arange(k, device=sequence.device)  # [k]
    found = (start >= 0) & (positions < length)  # the continuation stops at the sequence's end
    return torch.where(found, sequence[positions.clamp(0, capacity - 1)], -1)


LOOKUP = "lookup"  # the plan's name for prompt lookup searched inside the graph (greedy; its rounds chain)
LOOKUP_NGRAMS = (3, 1)  # the (max_ngram, min_ngram) captured: the drafter's defaults (others run as GIVEN would not)


def planned_draft(drafter: Any) -> Any:
    """What a drafter's rounds are captured as: its model (a model draft, drafted inside the graph), ``LOOKUP``
    (prompt lookup over the sequence alone: searched inside the graph) or ``GIVEN`` (any other drafter: it
    proposes, the graph verifies its ids)."""
    if type(drafter) is ModelDrafter:
        return drafter.model
    if type(drafter) is PromptLookupDrafter:
        return LOOKUP
    return GIVEN


def _graph_for(run: Any, k: int, wanted: int) -> RoundGraph | None:
    """The captured round that can run this round of ``run`` (a :class:`specdec.decoding._Run`), or None: that of
    k drafts, else that of ``wanted`` (the schedule's gamma, more than the budget leaves: a whole round whose
    tokens past the budget are dropped costs less than the same round step by step). A round of given drafts
    is returned only when plain decoding's graph is there too (for a proposal that comes back empty)."""
    graph = _graph_of(run, k)
    if graph is None and 0 < k < wanted:
        graph = _graph_of(run, wanted)
    return graph


def _graph_of(run: Any, k: int) -> RoundGraph | None:
    session, config, drafter = run.session, run.config, run.drafter
    rounds = getattr(getattr(session, "cache", None), "rounds", None)
    if not rounds or config.lenience < 1.0 or run.schedule.name not in GRAPHED_SCHEDULES:
        return None
    if config.verification == "block" and not config.sampling.greedy:
        return None
    length = len(run.sequence)
    if length < 2 or session.length != length - 1:
        return None
    key: tuple[Any, int, SamplingParams] = (None, 0, config.sampling)
    planned = planned_draft(drafter) if k > 0 else None
    if planned is LOOKUP:
        if not config.sampling.greedy or (drafter.max_ngram, drafter.min_ngram) != LOOKUP_NGRAMS:
            return None
        key = (LOOKUP, k, config.sampling)
    elif k > 0 and planned is not GIVEN:
        draft_session = drafter.session
        draft_cache = getattr(draft_session, "cache", None)
        if draft_cache is None or not length - 2 <= draft_session.length <= length or length + k > draft_cache.capacity:
            return None
        key = (id(draft_cache), k, config.sampling)
    elif k > 0:
        if not config.sampling.greedy or (None, 0, config.sampling) not in rounds:
            return None
        key = (GIVEN, k, config.sampling)
    graph = rounds.get(key)
    if graph is None or length - 1 + graph.width > session.cache.capacity:
        return None
    return graph


def _chainable(run: Any, graph: RoundGraph, length: int) -> bool:
    """Whether the round after this one (at ``length``) can be launched now, before this one is read: a model
    draft's round, a looked-up one or a plain step (their next inputs are on the device), a constant gamma (no choice waits on
    this round's acceptances), and room for it whatever this round accepts, in the budget and in both caches.
    A generation that ends at this round (EOS, a stop string) leaves that one launched round unused."""
    if graph.given or run.schedule.name != "constant" or (graph.gamma == 0) != (run.drafter is None):
        return False
    after = length + graph.gamma + 1  # the longest the sequence can be after this round
    if after - run.start_len >= run.limit or after - 1 + graph.width > run.session.cache.capacity:
        return False
    return graph.draft_cache is None or after + graph.gamma <= graph.draft_cache.capacity


def graphed_round(run: Any, k: int, wanted: int | None = None) -> Round | None:
    """Run this round of ``run`` (k drafts, within the budget; 0: a plain step) as its captured graph: one
    replay, one read-back. ``wanted``: the schedule's gamma (a round of that many drafts may run when none of
    k is captured; its tokens are cut to the k + 1 the budget allows). None when no captured round fits (the
    caller runs it step by step)."""
    ahead, run.ahead = run.ahead, None
    graph = _graph_for(run, k, k if wanted is None else wanted) if ahead is None else ahead[0]
    if graph is None:
        return None
    length = len(run.sequence)
    proposal, draft_calls = None, 0
    if ahead is None:
        t0 = run.clock.mark()
        if graph.given:  # the drafter proposes as it always does; the graph verifies its ids
            before = run.drafter.forward_passes
            proposal = run.drafter.propose(run.sequence, k)
            draft_calls = run.drafter.forward_passes - before
            if len(proposal) == 0:
                graph = run.session.cache.rounds[(None, 0, run.config.sampling)]
        t1 = run.clock.mark()
        slot = graph.stash(graph.replay(run.ids, length, run.stats.seed or 0, proposal.tokens if graph.given else None))
        t2 = run.clock.mark()
    else:  # launched during the last round, on the inputs it left; marks taken around its launch
        _, slot, t1, t2 = ahead
        t0 = t1
        run.stats.rounds_chained += 1
    if _chainable(run, graph, length):  # the next round goes to the device before this one is read
        t3 = run.clock.mark()
        run.ahead = (graph, graph.stash(graph.replay_chained()), t3, run.clock.mark())
    values = slot.read()  # [3 gamma + 2]: the round's one synchronization
    out = slot.device
    gamma = graph.gamma
    n = int(values[0])
    if proposal is not None:
        g = len(proposal)  # drafted tokens
    elif graph.lookup:  # a looked-up proposal: -1 past its end
        g = sum(1 for t in values[2 * gamma + 2:] if t >= 0)
    else:
        g = gamma
    new = [int(t) for t in values[1: n + 2]][: k + 1]  # a round wider than the budget: cut to it
    betas = values[2 + gamma: 2 + gamma + min(n + 1, g)]
    run.session.advanced(length + n, passes=1, tokens=g + 1)  # it keeps the sequence and the accepted drafts
    if graph.draft is not None:  # a model draft's round: the graph drafted and the draft cache advanced
        run.drafter.session.advanced(length + n - 1, passes=gamma, tokens=1)  # the next round re-feeds the last two
        run.drafter.forget_proposal()
        draft_calls = gamma
    elif run.drafter is not None:  # given or looked-up drafts, or a plain step of a drafting generation
        run.drafter.update(n)
    run.stats.rounds_graphed += 1
    if proposal is None:
        proposal = Draft(out[2 * gamma + 2: 2 * gamma + 2 + g].long())
    # views of the slot (float64), valid until the replay after next: the loop copies the tokens into run.ids
    result = Verification(out[1: gamma + 2], out[0], out[gamma + 2: 2 * gamma + 2])
    return Round(proposal, result, new, n, betas, draft_calls, run.clock.seconds(t0, t1), run.clock.seconds(t1, t2))
