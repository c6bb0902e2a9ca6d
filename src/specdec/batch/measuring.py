"""The batch's measured costs: timed at startup (:func:`calibrate`, before the first request) and reported
(:func:`report`, ``specdec serve``'s /health), for the gamma policy of :mod:`specdec.batch.speculation`."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from specdec.models.sessions.batch_session import BatchSession


#: Prefills of the draft that calibrate times for the feed cost (the best counts)
FEED_TIMINGS = 3


def calibrate(engine: Any, context: int = 128, widths: Sequence[int] = (1, 2, 3, 5)) -> dict:
    """Time the target's pass over B rows x w tokens (w in ``widths``) and the draft's step of B rows, for B in
    1, 2, 4, ... up to max_batch, each row holding ``context`` positions, and seed the batch's gamma policy
    (:class:`~specdec.batch.speculation.BatchGamma`) with them, so that its first decisions at each batch size are
    read off measured costs instead of drafting rounds tried there (each of which first catches every row's draft
    up). ``specdec serve`` calls it while it loads (a few seconds for the CPU default pair); the rounds' own times
    replace these as they come. Returns {"target": {tokens: s}, "draft": {rows: s}}; nothing where the engine has no
    draft model, or does not decide by measured costs, or holds requests."""
    if engine.draft_session is None or engine.speculation != "measured" or engine.busy:
        return {}
    sizes = sorted({b for b in (1, 2, 4, 8, 16, 32, 64) if b <= engine.max_batch} | {engine.max_batch})
    context = max(1, min(context, engine.max_positions - max(widths) - 1))
    vocab = min(engine.target.vocab_size, engine.draft_model.vocab_size)
    ids = [(7 * i) % (vocab - 1) + 1 for i in range(context)]  # any tokens: a pass's time does not depend on them
    token = torch.tensor([ids[-1]], dtype=torch.long, device=engine.target.device)
    times: dict[str, dict[int, float]] = {"target": {}, "draft": {}}

    def timed(session: BatchSession, rows: int, width: int) -> float:
        best = float("inf")
        for _ in range(1 if times["target"] or times["draft"] else 2):  # (a first pass may pay for buffers)
            start = engine.clock.mark()
            session.extend([token.repeat(width)] * rows, [width] * rows)
            best = min(best, engine.clock.seconds(start, engine.clock.mark()))
            for slot in range(rows):
                session.rollback(slot, context)
        return best

    for name, session in (("target", engine.target_session), ("draft", engine.draft_session)):
        # what a fed prompt token costs the draft (BatchGamma.feed_pays): the best of FEED_TIMINGS prefills, as a
        # warm server pays it; its first passes pay one-off costs (AVX2 EPYC, 128 tokens: 7.2-8.0 ms a token in the
        # first two, 3.1-3.6 after), and a seed that high priced every feed (feed_pays, a lone row's start) at twice
        # what it costs
        feed = float("inf")
        for _ in range(FEED_TIMINGS if name == "draft" else 1):
            session.rollback(0, 0)
            start = engine.clock.mark()
            session.prefill(0, ids)
            feed = min(feed, engine.clock.seconds(start, engine.clock.mark()))
        if name == "draft":
            engine.gamma_policy.observe_feed(len(ids), feed)
        for slot in range(1, engine.max_batch):
            session.move(0, slot)
        for rows in sizes:
            for width in (widths if name == "target" else (1,)):
                times[name][rows * width if name == "target" else rows] = timed(session, rows, width)
        for slot in range(engine.max_batch):
            session.rollback(slot, 0)
    for tokens, seconds in times["target"].items():
        engine.gamma_policy.target_time.observe(tokens, seconds)
    for rows, seconds in times["draft"].items():
        engine.gamma_policy.draft_time.observe(rows, seconds)
    return times


def report(engine: Any) -> dict:
    """How the batch speculates, measured (``specdec serve``'s /health): the mode, the gamma last chosen per
    batch size, the pass times per tokens fed and the draft step per rows it decides from, the pooled alpha, what a
    token fed to the draft costs and the requests' mean length (whether a row's draft is fed), what drafting and plain
    rounds gave per batch size (:meth:`~specdec.batch.speculation.BatchGamma.vetoes`), the gate's rates."""
    policy = engine.gamma_policy
    return {"speculation": engine.speculation, "rounds": engine.rounds,
            "gamma_by_rows": dict(sorted(policy.decided.items())),
            "pass_seconds": {n: round(t, 4) for n, t in sorted(policy.target_time.items())},
            "draft_step_seconds": {b: round(t, 4) for b, t in sorted(policy.draft_time.items())},
            "pooled_alpha": round(policy.pooled.value, 3),
            "draft_feed_seconds_per_token": None if policy.feed_seconds is None else round(policy.feed_seconds, 5),
            "mean_output_tokens": None if policy.output_tokens is None else round(policy.output_tokens, 1),
            "rounds_tokens_per_s": {f"{rows} {'drafting' if d else 'plain'}": round(policy.realized(rows, d), 2)
                                    for rows, d in sorted(policy.realized_sides())},
            **({"gate": engine.gate.report()} if engine.gate is not None else {})}
