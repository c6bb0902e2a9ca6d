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

and the host reads ``out`` once. Any other drafter (prompt lookup, n-grams, a hierarchy, another tokenizer)
proposes on its own, and at temperature 0 its proposal is verified in a graph of the same form that takes the
drafts as an input (``given``: [gamma] ids, -1 past the proposal, never equal to the target's choice). Random numbers come from :class:`~specdec.counter_random.PositionalRandom`
keyed by the seed and L, so a replay draws what an eager run of the same function draws. gamma = 0 with no
draft is plain decoding's step, its sampling included.

The draft's first step always feeds the last two tokens (the per-step drafter feeds one or two, whichever its
cache lacks), so one graph serves every round, and the draft's cache is rolled back to L' - 2 after each.
Re-feeding a cached token rewrites its key and value with what a 2-token pass computes: the drafts may differ
in the last bits from the per-step path's, the output never does (it is verified).

The graphs are captured by :func:`prepare_rounds` (from :func:`specdec.decoding.prepare_steps`), one per
(draft cache, gamma, sampling), kept on the target's cache and captured into the target's graph pool; a
generation only replays them. A round outside that plan runs step by step as before: the first round (its
token comes with the prefill), a gamma or a sampling not captured (a shorter round at the end of the budget),
lenience, sampled block verification, the adaptive and confidence schedules (they read per-phase times or
stop the draft on the host), and every drafter but a model draft when sampling (its q would be an input too).
``GenerationStats.rounds_graphed`` and ``rounds_per_step`` count both. A model draft's graphed round is timed
as one: its time counts as the target's (``time_target``), none of it as drafting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch

from specdec.acceptance import Verification, verify
from specdec.counter_random import MASK32, PositionalRandom
from specdec.drafters.base import Draft
from specdec.drafters.model import ModelDrafter, draft_token
from specdec.models import graphs
from specdec.models.graphs import MAX_GRAPH_WIDTH, WARMUP_RUNS, bucket_for
from specdec.rounds import Round
from specdec.sampling import SamplingParams

if TYPE_CHECKING:
    from specdec.models.causal import LanguageModel
    from specdec.models.static_cache import StaticKVCache

GRAPHED_SCHEDULES = ("constant", "heuristic")  # they choose gamma from acceptances alone, not from phase times
GIVEN = "given"  # the plan's name for rounds whose drafts come from outside the graph (any drafter, greedy)
GREEDY = SamplingParams()


class RoundGraph:
    """One round of ``draft`` (None: a plain step, gamma 0) at ``gamma`` under ``sampling``, on two static caches."""

    def __init__(self, target: "LanguageModel", target_cache: "StaticKVCache", draft: "LanguageModel | None",
                 draft_cache: "StaticKVCache | None", gamma: int, sampling: SamplingParams, given: bool = False):
        if given and (draft is not None or not sampling.greedy or gamma == 0):
            raise ValueError("a round graph of given drafts verifies gamma >= 1 ids at temperature 0, without a model")
        if not given and (draft is None) != (gamma == 0):
            raise ValueError("a round graph drafts gamma >= 1 tokens with a draft model, or is a plain step (gamma 0)")
        self.width = bucket_for(gamma + 1)  # the target's pass, padded to its bucket (the per-step graphs' shapes)
        if self.width is None:
            raise ValueError(f"gamma {gamma} verifies {gamma + 1} tokens, wider than the widest graph")
        device = target_cache.device
        self.target, self.target_cache, self.draft, self.draft_cache = target, target_cache, draft, draft_cache
        self.gamma, self.sampling, self.given = gamma, sampling, given
        self.drafts = torch.full((gamma,), -1, dtype=torch.long, device=device)  # [gamma] static input when given
        self.tail = torch.zeros(1, 2, dtype=torch.long, device=device)  # [1, 2] static input: the last two tokens
        self.start = torch.zeros(1, dtype=torch.long, device=device)  # [1] static input: the sequence length L
        self.seed = torch.zeros(1, dtype=torch.long, device=device)  # [1] static input
        self.draft_ids = torch.zeros(1, 1, dtype=torch.long, device=device)  # [1, 1] the drafted token fed back
        self.target_ids = torch.zeros(1, self.width, dtype=torch.long, device=device)  # [1, w] the verified tokens
        self.graph: Any = None
        self.out: torch.Tensor | None = None  # [3 gamma + 2] float64, rewritten by every replay

    @torch.inference_mode()
    def run(self) -> torch.Tensor:
        """The round, computed from the static inputs (what the graph captures): out [3 gamma + 2] float64."""
        gamma, sampling, vocab = self.gamma, self.sampling, self.target.vocab_size
        rng = PositionalRandom(self.seed, self.start)
        drafts: list[torch.Tensor] = []  # [1] long each
        qs: list[torch.Tensor] = []  # [V] each (sampling)
        if self.given:
            drafts = [self.drafts]
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
        return torch.cat([result.n.reshape(1).double(), result.tokens.double(), result.betas.double(), drafted.double()])

    def capture(self, pool: Any) -> None:
        """Warm up (on a side stream, at positions 0 .. gamma + width), then capture :meth:`run` into ``pool``."""
        self.start.fill_(2)
        with graphs.side_stream():
            for _ in range(WARMUP_RUNS):
                self.run()
        self.graph, self.out = graphs.capture(self.run, pool)

    def replay(self, ids: torch.Tensor, length: int, seed: int, drafts: torch.Tensor | None = None) -> torch.Tensor:
        """Replay the round after ``ids[:length]`` (the sequence on the device; ``drafts`` [g <= gamma] when given);
        ``out``, valid until the next replay."""
        self.set_inputs(ids, length, seed, drafts)
        with torch.inference_mode():
            self.graph.replay()
        return self.out

    def set_inputs(self, ids: torch.Tensor, length: int, seed: int, drafts: torch.Tensor | None = None) -> None:
        """Fill the static inputs (device copies and fills: no host sync)."""
        if drafts is not None:
            self.drafts[: drafts.shape[0]].copy_(drafts)
            self.drafts[drafts.shape[0]:].fill_(-1)
        self.tail[0].copy_(ids[length - 2: length])
        self.start.fill_(length)
        self.seed.fill_(seed & MASK32)


def planned_draft(drafter: Any) -> Any:
    """What a drafter's rounds are captured as: its model (a model draft, drafted inside the graph) or ``GIVEN``
    (any other drafter: it proposes, the graph verifies its ids)."""
    return drafter.model if type(drafter) is ModelDrafter else GIVEN


def prepare_rounds(target: "LanguageModel", plan: Sequence[tuple[Any, int]], samplings: Sequence[SamplingParams],
                   max_positions: int | None) -> None:
    """Capture a round graph for every (draft model, ``GIVEN`` or None, gamma) of ``plan`` (:func:`planned_draft`)
    and every sampling (given drafts: greedy only), on the caches that later generations of up to
    ``max_positions`` positions take (after each model's ``prepare_steps``). A round captured already is kept."""
    if not target.cuda_graphs:
        return
    session, _ = target.start([0], _planned_positions(target, max_positions))
    cache = session.cache

    def ensure(key: tuple[Any, int, SamplingParams], *args: Any, given: bool = False) -> None:
        gamma = key[1]
        if key not in cache.rounds and bucket_for(gamma + 1) is not None:
            graph = RoundGraph(target, cache, *args, gamma, key[2], given=given)
            graph.capture(target.graph_pool())
            cache.rounds[key] = graph

    try:
        for draft in dict.fromkeys(d for d, _ in plan):
            gammas = sorted({g for d, g in plan if d is draft})
            if draft is GIVEN:
                for gamma in gammas if GREEDY in samplings else ():
                    ensure((GIVEN, gamma, GREEDY), None, None, given=True)
                continue
            if draft is not None and not draft.cuda_graphs:
                continue
            draft_session = draft.start([0], _planned_positions(draft, max_positions))[0] if draft is not None else None
            draft_cache = draft_session.cache if draft_session is not None else None
            try:
                for gamma in gammas:
                    for sampling in dict.fromkeys(samplings):
                        ensure((id(draft_cache) if draft_cache is not None else None, gamma, sampling), draft, draft_cache)
            finally:
                if draft_session is not None:
                    draft_session.close()
    finally:
        session.close()


def _planned_positions(model: "LanguageModel", max_positions: int | None) -> int | None:
    """The positions of the caches ``model.prepare_steps`` fixed (so the rounds are captured on the caches later
    generations take), or ``max_positions`` for a model never prepared."""
    return model.capacity - MAX_GRAPH_WIDTH if model.capacity is not None else max_positions


def _graph_for(run: Any, k: int) -> RoundGraph | None:
    """The captured round that can run this round of ``run`` (a :class:`specdec.decoding._Run`), or None. A round
    of given drafts is returned only when plain decoding's graph is there too (for a proposal that comes back empty)."""
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
    if k > 0 and planned_draft(drafter) is not GIVEN:
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


def graphed_round(run: Any, k: int) -> Round | None:
    """Run this round of ``run`` (k drafts; 0: a plain step) as its captured graph: one replay, one read-back.
    None when no captured round fits (the caller runs it step by step)."""
    graph = _graph_for(run, k)
    if graph is None:
        return None
    length = len(run.sequence)
    t0 = run.clock.mark()
    proposal, draft_calls = None, 0
    if graph.given:  # the drafter proposes as it always does; the graph verifies its ids
        before = run.drafter.forward_passes
        proposal = run.drafter.propose(run.sequence, k)
        draft_calls = run.drafter.forward_passes - before
        if len(proposal) == 0:
            graph = run.session.cache.rounds[(None, 0, run.config.sampling)]
    t1 = run.clock.mark()
    gamma = graph.gamma
    out = graph.replay(run.ids, length, run.stats.seed or 0, proposal.tokens if graph.given else None)
    values = out.tolist()  # [3 gamma + 2]: the round's one synchronization
    t2 = run.clock.mark()
    n = int(values[0])
    g = len(proposal) if proposal is not None else gamma  # drafted tokens
    new = [int(t) for t in values[1: n + 2]]
    betas = values[2 + gamma: 2 + gamma + min(n + 1, g)]
    run.session.advanced(length + n, passes=1, tokens=g + 1)  # it keeps the sequence and the accepted drafts
    if proposal is None and gamma > 0:  # a model draft's round: the graph drafted and the draft cache advanced
        run.drafter.session.advanced(length + n - 1, passes=gamma, tokens=1)  # the next round re-feeds the last two
        run.drafter.forget_proposal()
        draft_calls = gamma
    elif run.drafter is not None:  # given drafts, or a plain step of a drafting generation (as step by step)
        run.drafter.update(n)
    run.stats.rounds_graphed += 1
    if proposal is None:
        proposal = Draft(out[2 * gamma + 2:].long())
    # views of ``out`` (float64), read before the next replay: the loop copies the tokens into run.ids
    result = Verification(out[1: gamma + 2], out[0], out[gamma + 2: 2 * gamma + 2])
    return Round(proposal, result, new, n, betas, draft_calls, run.clock.seconds(t0, t1), run.clock.seconds(t1, t2))


def prepare_steps(target: "LanguageModel", drafts: Sequence[Any], gammas: Sequence[int],
                  max_positions: int | None = None,
                  samplings: Sequence[SamplingParams] = (SamplingParams(),)) -> "list[LanguageModel]":
    """With CUDA graphs, fix the capture plan of the target and of every model that generations with
    ``drafts`` (each what ``generate(draft=...)`` takes; none: plain decoding) and these gammas run
    (:meth:`LanguageModel.prepare_steps`: one cache capacity, ``max_positions``, and the width buckets up
    to each model's widest step captured), so that no capture lands inside a timed or waited-for
    generation. The target's widest step verifies gamma drafts after one token (gamma + 1; plain
    decoding: 1); each drafter names the models it runs and their widths
    (:meth:`~specdec.drafters.base.Drafter.step_widths`). Plain decoding's step and every model draft's
    round at each gamma are also captured whole, per sampling in ``samplings`` (default: greedy), as one
    graph each (:mod:`specdec.round_graph`). Returns the models prepared."""
    import warnings

    from specdec.drafters import plan_draft
    from specdec.models.causal import LanguageModel

    widest: dict[Any, int] = {target: 1}  # model -> its widest step
    rounds: list[tuple[Any, int]] = [(None, 0)]  # (draft model, gamma) of the rounds captured whole; plain's step
    for draft in drafts:
        plan = plan_draft(draft).load(target)  # its models load once, not once per gamma
        for gamma in gammas:
            drafter = plan.build(target, inner_gamma=gamma)
            if drafter is not None:
                widest[target] = max(widest[target], gamma + 1)
                rounds.append((planned_draft(drafter), gamma))
                for model, widths in drafter.step_widths(gamma).items():
                    widest[model] = max([widest.get(model, 1), *widths])
    if target.cuda_graphs and drafts and max(gammas, default=0) + 1 > MAX_GRAPH_WIDTH:
        warnings.warn(f"gamma {max(gammas)} verifies {max(gammas) + 1} tokens, wider than the largest captured step "
                      f"({MAX_GRAPH_WIDTH}): those verifications run eagerly", RuntimeWarning, stacklevel=2)
    prepared = [m for m in widest if isinstance(m, LanguageModel)]
    for model in prepared:
        model.prepare_steps(max_positions, widest[model])
    prepare_rounds(target, rounds, samplings, max_positions)
    return prepared
