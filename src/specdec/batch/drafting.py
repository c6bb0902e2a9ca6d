"""What the rows of a batch (:mod:`specdec.batch.engine`) draft with, and the draft model's proposals for them: every
drafting row fed in one pass of the batched draft session per draft step, each row sampled with its own settings
and random source; a row far behind (after plain rounds) is caught up first."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from specdec.batch.row import MODEL, BatchRow
from specdec.drafters.base import Draft
from specdec.drafters.model import draft_token, fit_width
from specdec.drafters.plan import DRAFTER_NAMES, DraftKind, DraftPlan, plan_draft
from specdec.errors import SpecDecError
from specdec.models import load
from specdec.models.sessions.batch_session import BatchSession

CATCH_UP = 63  # a draft row further behind than this is caught up alone first (the round's pass feeds < PAD tokens)
#: A row far behind catches up only where it may still generate this many tokens per token it catches up: the 0.5B
#: feeds about 3.5 ms a token on 2 cores, a drafting row of a mid-size batch saves about 7 ms a token it generates
CATCH_UP_PAYS = 0.5
LEFT = 2  # tokens a drafting round leaves its draft to feed (its accepted drafts' last and the target's token)
#: Tokens a round's catch-ups feed at most, all rows together (a prompt the draft was not fed goes in over several
#: rounds, the row drafting once it is in, as chunked prefill: about 0.9 s of the 0.5B on 2 cores)
CATCH_UP_CHUNK = 256


def propose_model(session: BatchSession, rows: list[BatchRow], ks: list[int], vocab_size: int,
                  device: torch.device, clock: Any = None, policy: Any = None) -> tuple[list[Draft], float]:
    """The draft model's proposals for the rows with k > 0 (and row.draft == MODEL): one pass per step of
    ``session`` (the engine's draft session, row i in slot i); and the seconds its catch-ups took (timed with
    ``clock``, a :class:`~specdec.devices.RoundClock`; 0.0 without one): not the draft steps' time. A row far
    behind catches up where the batch's gamma ``policy`` (:class:`~specdec.batch.speculation.BatchGamma`) says
    that pays (:meth:`~specdec.batch.speculation.BatchGamma.feed_pays`; before it can tell, CATCH_UP_PAYS)."""
    empty = torch.empty(0, dtype=torch.long, device=device)
    drafting = [row.draft == MODEL and k > 0 for row, k in zip(rows, ks)]
    start = clock.mark() if clock is not None else None
    # a row behind (plain rounds; a prompt its draft was not fed) catches up first, all but the 1-2 tokens a drafting
    # round leaves its draft to feed: far behind, alone in a pass over what it missed (a batched pass would pad every
    # row to the widest), at most CATCH_UP_CHUNK tokens a round (a row still behind drafts nothing this round); a
    # little behind, in one batched pass. Timed apart: a catch-up is no draft step (the batch's gamma reads those).
    budget, caught = CATCH_UP_CHUNK, False
    for i, row in enumerate(rows):
        held = session.lengths[i]
        gap = len(row.sequence) - held
        if not drafting[i] or gap <= CATCH_UP:
            continue
        generated = len(row.sequence) - row.start_len
        left = row.limit - generated
        pays = policy.feed_pays(len(rows), gap, left, generated) if policy is not None else None
        if pays is None:
            pays = left >= gap * CATCH_UP_PAYS
        if not pays:
            drafting[i] = False  # too few tokens left to pay for it: the row goes on plain
        else:
            end = min(len(row.sequence) - 1, held + budget)
            if end > held:
                fed_at = clock.mark() if clock is not None else None
                session.prefill(i, row.sequence[:end], held)
                if fed_at is not None and policy is not None:
                    policy.observe_feed(end - held, clock.seconds(fed_at, clock.mark()))
                budget -= end - held
                caught = True
            drafting[i] = len(row.sequence) - end <= CATCH_UP
    gaps = [len(row.sequence) - session.lengths[i] if drafting[i] else 0 for i, row in enumerate(rows)]
    if max(gaps, default=0) > LEFT:
        session.extend([row.ids[session.lengths[i]: len(row.sequence) - 1] if g > LEFT else empty
                        for i, (row, g) in enumerate(zip(rows, gaps))], [0] * len(rows))
        caught = True
    caught_up = clock.seconds(start, clock.mark()) if clock is not None and caught else 0.0
    if not any(drafting):
        return [Draft.empty(device) for _ in rows], caught_up
    feeds = [row.ids[session.lengths[i]: len(row.sequence)] if drafting[i] else empty for i, row in enumerate(rows)]
    logits = session.extend(feeds, [1 if d else 0 for d in drafting])  # [1, V] per drafting row
    tokens: list[list[torch.Tensor]] = [[] for _ in rows]
    qs: list[list[torch.Tensor]] = [[] for _ in rows]
    going = list(drafting)
    for step in range(max(ks, default=0)):
        for i, row in enumerate(rows):
            if not going[i]:
                continue
            stop_below = row.config.confidence if row.config.gamma_schedule == "confidence" else None
            row_logits = logits[i][-1]  # [V']
            if row.constraint is not None:  # the row's mask at this depth (its committed sequence is depth 0)
                row_logits = row.constraint.restrict(fit_width(row_logits, vocab_size), step)
                going[i] = bool(torch.isfinite(row_logits).any())
                if not going[i]:
                    continue
            drafted = draft_token(row_logits, vocab_size, row.config.sampling, row.generator, stop_below)
            if drafted is None or (row.constraint is not None and not row.constraint.push(step, int(drafted[0]))):
                going[i] = False
                continue
            x, q = drafted
            if q is not None:
                qs[i].append(q)
            tokens[i].append(x)
            going[i] = len(tokens[i]) < ks[i]
        if not any(going):
            break
        logits = session.extend([tokens[i][-1].reshape(1) if going[i] else empty for i in range(len(rows))],
                                [1 if g else 0 for g in going])
    drafts = []
    for i, row in enumerate(rows):
        if drafting[i]:
            row.proposed = (len(row.sequence), len(tokens[i]))
        drafts.append(Draft(torch.stack(tokens[i]), torch.stack(qs[i]) if qs[i] else None) if tokens[i]
                      else Draft.empty(device))
    return drafts, caught_up


def batch_drafting(target: Any, draft: Any) -> tuple[Any, Any]:
    """What the rows of a batch for ``target`` draft with, from any ``draft=`` (a specification, a plan, a
    loaded model, a drafter; the library's and ``specdec serve``'s): (the engine's draft model or None, each
    row's ``draft=`` for :meth:`BatchEngine.add`: MODEL, a parameter-free drafter's name, or None). A hierarchy
    (``'A<-prompt-lookup'``): the batch's rows draft with its top model, a lone row with the whole hierarchy
    (:func:`alone_draft`)."""
    plan = plan_draft(draft)
    kind = plan.kind
    if kind is DraftKind.PLAIN:
        return None, None
    level = plan.levels[0].name
    if kind is DraftKind.DRAFTER:
        if not isinstance(level, str):
            raise SpecDecError(f"a batch gives each row a drafter of its own: name it ({', '.join(DRAFTER_NAMES)}) "
                               f"rather than pass one object ({type(level).__name__})")
        return None, level
    from specdec.models import same_vocabulary

    model = load(plan.load(target).levels[0].name) if kind is not DraftKind.HIERARCHY else _top_model(plan, target)
    if model.hf_model is None:
        raise SpecDecError(f"a batch drafts with a torch model; {model.name!r} runs in llama.cpp (a llama.cpp draft "
                           "runs one sequence at a time: specdec.generate, or specdec serve --max-batch 1)")
    if model.is_encoder_decoder or not same_vocabulary(target, model):
        raise SpecDecError(f"a batch drafts with a model that shares the target's tokenizer; {model.name!r} does not "
                           "(a draft with another tokenizer runs one sequence at a time: specdec.generate, or "
                           "specdec serve --max-batch 1)")
    return model, MODEL


def _top_model(plan: Any, target: Any) -> Any:
    """A hierarchy's top level, loaded (its other levels are not: a lone row builds them, :func:`alone_draft`)."""
    return load(DraftPlan(plan.levels[:1]).load(target).levels[0].name)


def alone_draft(draft: Any, model: Any) -> Any:
    """What a lone row of a batch drafts with through the one-sequence engine (:mod:`specdec.batch.alone`), over
    the engine's draft ``model`` (loaded once, shared with the batch's rows): ``draft`` with its top level
    replaced by ``model`` (a hierarchy keeps its lower levels), or ``model`` alone."""
    from specdec.drafters.spec import DraftLevel

    plan = plan_draft(draft)
    if model is None or plan.kind is not DraftKind.HIERARCHY:
        return model
    return dataclasses.replace(plan, levels=(DraftLevel(model, None), *plan.levels[1:]))  # (copying first kept)
