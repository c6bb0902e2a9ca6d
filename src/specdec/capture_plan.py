"""The capture plan, fixed before any generation: every model's step widths (:meth:`LanguageModel.prepare_steps`,
prefill chunks included) and the whole rounds of :mod:`specdec.round_graph`, so that nothing is captured or
compiled inside a timed or waited-for generation. :func:`prepare_steps` is the one call (``specdec bench``
before timing, ``specdec serve`` before it reports ready); its public home is :mod:`specdec.decoding`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from specdec.models.sessions.graphs import MAX_GRAPH_WIDTH, bucket_for
from specdec.round_graph import GIVEN, GREEDY, LOOKUP, LOOKUP_NGRAMS, RoundGraph, planned_draft
from specdec.sampling import SamplingParams

if TYPE_CHECKING:
    from specdec.models.causal import LanguageModel


def prepare_rounds(target: "LanguageModel", plan: Sequence[tuple[Any, int]], samplings: Sequence[SamplingParams],
                   max_positions: int | None) -> None:
    """Capture a round graph for every (draft model, ``LOOKUP``, ``GIVEN`` or None, gamma) of ``plan``
    (:func:`~specdec.round_graph.planned_draft`) and every sampling (looked-up and given drafts: greedy only),
    on the caches that later generations of up to
    ``max_positions`` positions take (after each model's ``prepare_steps``). A round captured already is kept."""
    if not target.cuda_graphs:
        return
    session, _ = target.start([0], _planned_positions(target, max_positions))
    cache = session.cache

    def ensure(key: tuple[Any, int, SamplingParams], *args: Any, **kind: Any) -> None:
        gamma = key[1]
        if key not in cache.rounds and bucket_for(gamma + 1) is not None:
            graph = RoundGraph(target, cache, *args, gamma, key[2], **kind)
            graph.capture(target.graph_pool())
            cache.rounds[key] = graph

    try:
        for draft in dict.fromkeys(d for d, _ in plan):
            gammas = sorted({g for d, g in plan if d is draft})
            if draft is GIVEN or draft is LOOKUP:
                for gamma in gammas if GREEDY in samplings else ():
                    kind = {"given": True} if draft is GIVEN else {"lookup": LOOKUP_NGRAMS}
                    ensure((draft, gamma, GREEDY), None, None, **kind)
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
