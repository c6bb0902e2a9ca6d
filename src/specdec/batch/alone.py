"""A batch's only row runs through the one-sequence engine: the batch engine and :func:`specdec.generate` are
one engine at one row.

A batch of one row gains nothing from batching and pays for it: transformers' forward over a padded, masked
batch cache, and a draft of one model where the one-sequence engine has its decoder step (every layer in one
extension call) and a hierarchy (the 0.5B under prompt lookup). So while a :class:`~specdec.batch.engine.BatchEngine`
holds one row and none waits, that row's rounds are :func:`specdec.decoding`'s own (``_round``), over a session
of its own and the engine's draft for a lone row (``alone_draft``). When a second request has joined (prefilled in
its own slot), the row goes back into its slot before the next round; when the batch is down to one row again, that
row goes on alone. More rows run batched (:func:`rounds_alone` says why). One thing differs from
:func:`specdec.generate`: the server has measured its costs, so the lone row's hierarchy starts its model only where
feeding it what it lacks pays (:func:`start_pays`); until then copies and prompt lookup draft for the target.

Each move copies the keys and values the row holds (target and model draft), nothing is recomputed: with a
block-invariant target (int8 / int4) a position's keys and values are the same bits whichever engine computed
them (each query row attends as a one-token step would, :mod:`specdec.models.native.row_attention`), so the row's
tokens are bit for bit what it gets alone from :func:`specdec.generate`, however often it moves
(tests/test_batch_alone.py). A float target's batch passes may round differently from one-sequence steps (as
between any two batch shapes), so its rows never move: they run in the batch.

A row moves where both engines can run it: a dynamic-cache target (the CPU engine) that is block-invariant, and
a row without a constraint (a grammar's state follows the batch's rounds) whose model draft, if any, is the
engine's own.
"""

from __future__ import annotations

from typing import Any, Callable

from specdec.batch.drafting import CATCH_UP
from specdec.batch.row import MODEL, BatchRow, ModelRowDrafter, row_context
from specdec.devices import RoundClock
from specdec.drafters.hierarchical import SpeculativeDrafter
from specdec.drafters.model import ModelDrafter
from specdec.models.sessions.window import contiguous_length
from specdec.run_state import finish_output
from specdec.schedules import make_schedule


def can_go_alone(engine: Any, row: BatchRow) -> bool:
    """Whether ``row`` may run through the one-sequence engine (see the module docstring)."""
    target = engine.target
    return (engine.alone and target.block_invariant and target.engine == "dynamic" and not target.cuda_graphs
            and row.constraint is None and (row.draft != MODEL or engine.alone_plan is not None))


def feeds_alone(engine: Any, row: BatchRow) -> bool:
    """Whether ``row``, joining an empty batch with none waiting, goes on alone, so that its prompt is not fed to the
    batch's draft model as it goes in: the lone row's drafter feeds its own model when it first drafts (copying
    first, on a long prompt, only once copies stop paying: an edit that copies may never pay it), and where a batch
    forms before that (a server's clients arriving together: the next prompt goes in while this row waits in the
    batch, :func:`waits_in_batch`) the feed is paid only where the batch drafts."""
    return not engine.rows and not engine.waiting and can_go_alone(engine, row)


def draft_gap(engine: Any, row: BatchRow) -> int:
    """The tokens of ``row``'s sequence its batch draft lacks (0 for a row without the batch's model draft)."""
    if row.draft != MODEL or engine.draft_session is None:
        return 0
    return len(row.sequence) - engine.draft_session.lengths[engine.rows.index(row)]


def feeding_does_not_pay(engine: Any, row: BatchRow, rows: int = 1) -> bool:
    """Whether ``row``'s batch draft is far behind its sequence (more than CATCH_UP tokens: a row the batch ran
    plain) and feeding it what it lacks would not pay at ``rows`` rows
    (:meth:`~specdec.batch.speculation.BatchGamma.feed_pays`)."""
    gap, generated = draft_gap(engine, row), len(row.sequence) - row.start_len
    return gap > CATCH_UP and engine.gamma_policy.feed_pays(rows, gap, row.limit - generated, generated) is False


def waits_in_batch(engine: Any, row: BatchRow) -> bool:
    """Whether ``row``, the batch's only row while another request's prompt goes in (it joins in a few rounds), stays
    in the batch for those rounds: where its batch draft was not fed (the batch ran it plain) and catching it up
    would not pay (:meth:`~specdec.batch.speculation.BatchGamma.feed_pays` at the rows the batch holds once the
    waiting requests joined: the row runs among them for the rest of its tokens). Alone, its draft model would be fed
    the whole sequence for the few rounds before the batch holds two rows again (about 0.8 s of the 0.5B for a chat
    request's 400 tokens on 2 cores; a server's first request while seven more go in: its prompt, for nothing where
    the batch of eight drafts nothing)."""
    return engine.filling is not None and feeding_does_not_pay(engine, row, engine.soon())


#: A lone row whose draft is far behind goes alone (its drafter catching its model up) only where it is likely to
#: generate this many tokens per token caught up: alone, drafting saves about 30 ms a token against plain rounds and
#: the 0.5B is fed about 4 ms a token (2 cores, AMX Xeon); the batch's Theorem 8 at one row (feed_pays) reads the
#: batch draft's saving, not the lone row's hierarchy's, and kept rows of 2 clients plain at one row (0.72x plain)
ALONE_CATCH_UP_PAYS = 0.15


def stays_in_batch(engine: Any, row: BatchRow) -> bool:
    """Whether ``row``, the batch's only row, goes on in the batch rather than alone: while the next prompt goes in
    (:func:`waits_in_batch`), or where it ran in the batch with its draft far behind (plain rounds) and too few
    tokens left to pay the catch-up alone (:data:`ALONE_CATCH_UP_PAYS`): the last row of a batch whose rows ran
    plain, a few tokens from its end (in one process, 4 completions at once: such a row went alone for its last 22
    tokens and took 1.8 s, its 0.5B fed 300 tokens first, against 0.9 s in the batch). In the batch it still copies
    from its context (:mod:`specdec.batch.copying`)."""
    if waits_in_batch(engine, row):
        return True
    gap, generated = draft_gap(engine, row), len(row.sequence) - row.start_len
    return (generated > 0 and gap > CATCH_UP
            and engine.gamma_policy.tokens_left(row.limit - generated, generated) < ALONE_CATCH_UP_PAYS * gap)


def start_pays(engine: Any, row: BatchRow) -> Callable[[int, int], bool | None]:
    """Whether feeding the lone row's draft model ``n`` tokens it lacks pays, ``generated`` tokens into the row
    (:attr:`~specdec.drafters.hierarchical.SpeculativeDrafter.start_pays`: the model's start, copying first): the
    time drafting saves over the tokens the row is likely still to generate (:meth:`~specdec.batch.speculation.
    BatchGamma.feed_saving` at one row, :meth:`~specdec.batch.speculation.BatchGamma.tokens_left`) against n times
    the measured seconds a fed token costs; None before the server measured them. No margin, where a batch row's
    feed has FEED_MARGIN: the batch's Theorem 8 reads its one-model draft, and the lone row's hierarchy (the model
    under prompt lookup) drafts for less. On the AVX2 EPYC the 0.5B is fed at ~6.7 ms a token and at one row
    drafting saves ~11 ms a generated token: a chat request's 140 new prompt tokens for its ~70-token answer do not
    pay (chat through the server 0.79-0.85x plain decoding, with the model started on every request)."""
    policy = engine.gamma_policy

    def pays(n: int, generated: int) -> bool | None:
        saving = policy.feed_saving(1)
        if saving is None:
            return None
        return policy.tokens_left(row.limit - generated, generated) * saving >= n * policy.feed_seconds

    return pays


def go_alone(engine: Any, row: BatchRow) -> bool:
    """Move ``row`` out of its slot: its keys and values into a session of its own (and its model draft's into the
    lone row's drafter), its schedule to the one-sequence engine's. False (nothing moved) where a cache cannot be
    carried."""
    target, batch, slot = engine.target, engine.target_session, engine.rows.index(row)
    positions = len(row.ids)  # the prompt, its new tokens and one more, as specdec.generate's session holds
    session, _ = target.start(row.prompt_ids, positions)
    if not hasattr(session, "adopt"):
        session.close()
        return False
    session.adopt(batch.read_row(slot), batch.lengths[slot])
    if row.draft == MODEL:
        drafter = engine.alone_plan.build(target, inner_gamma=row.config.gamma)
        draft_session, _ = engine.draft_model.start(row.prompt_ids, positions)
        if not isinstance(drafter, ModelDrafter) or not hasattr(draft_session, "adopt"):
            session.close()
            draft_session.close()
            return False
        if engine.draft_session.lengths[slot]:  # (a draft that has not drafted yet holds nothing: it catches up)
            draft_session.adopt(engine.draft_session.read_row(slot), engine.draft_session.lengths[slot])
        if isinstance(drafter, SpeculativeDrafter):
            drafter.start_pays = start_pays(engine, row)
        drafter.start(row_context(row), session=draft_session)
        row.drafter = drafter
    if row.prediction is not None:  # Predicted Outputs in front of whatever it drafts with (its counts go on)
        row.prediction.inner, row.drafter = row.drafter, row.prediction
    row.session, row.clock = session, RoundClock(target.device)
    engine.moves["alone"] += 1
    config = row.config
    schedule = row.parked or make_schedule(config.gamma_schedule, config.gamma, config.gamma_bound)
    row.parked, row.schedule = row.schedule, schedule
    return True


def go_back(engine: Any, row: BatchRow) -> None:
    """Move a lone row back into its slot of the batch (the batch runs batched rounds): the inverse of
    :func:`go_alone`."""
    session, slot = row.session, engine.rows.index(row)
    engine.target_session.write_row(slot, session.kv(), session.length)
    if row.prediction is not None:
        row.drafter, row.prediction.inner = row.prediction.inner, None
    if row.draft == MODEL:
        draft = row.drafter.session
        # the batch's draft row holds a prefix of the sequence; its first proposal catches up the rest
        engine.draft_session.write_row(slot, draft.kv(), min(contiguous_length(draft), len(row.sequence) - 1))
        row.drafter.close()
        row.drafter = ModelRowDrafter(engine.draft_model.name)
    session.close()
    engine.moves["back"] += 1
    row.session = row.clock = row.ahead = None
    row.parked, row.schedule = row.schedule, row.parked


def alone_round(row: BatchRow) -> bool:
    """One round of the lone row through the one-sequence engine; True when it finished (its output set, or
    its error: a callback raised, the client left)."""
    from specdec.decoding import _round

    try:
        _round(row)
    except Exception as err:  # the row's consumer failed or left (serve: Cancelled), or its round did
        row.error = err
    if row.error is None and row.stats.stop_reason:
        row.output = finish_output(row)
    return row.error is not None or bool(row.stats.stop_reason)


def release(row: BatchRow) -> None:
    """A lone row left: give its session and its drafter back (a row of the batch owns neither)."""
    if row.session is None:
        return
    try:
        row.session.close()
    finally:
        row.session = None
        if row.draft == MODEL and row.drafter is not None:
            row.drafter.close()  # (a prediction in front of it closes it too)


def rounds_alone(engine: Any) -> list[BatchRow] | None:
    """Where the batch holds one row (any waiting one had joined if it could) that may run alone: its round through
    the one-sequence engine; returns the rows that finished. None: the batch runs a batched round (a lone row went
    back into its slot). More rows run batched: measured at 2 rows (AVX-512 EPYC, the CPU default pair), rounds of
    each row alone in turn gave 37 tokens a second against the batch's 49 for plain rows, 39 against 45 drafting
    (docs/serving.md)."""
    rows = engine.rows
    if len(rows) == 1 and engine.alone and (rows[0].alone or (can_go_alone(engine, rows[0])
                                                              and not stays_in_batch(engine, rows[0])
                                                              and go_alone(engine, rows[0]))):
        engine.rounds += 1
        done = [row for row in list(rows) if alone_round(row)]
        engine._drop(done)
        return done
    for row in rows:
        if row.alone:
            go_back(engine, row)
    return None
