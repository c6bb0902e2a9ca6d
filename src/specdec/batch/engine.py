"""Batched speculative decoding: many sequences, one target pass per round, ragged acceptance.

    outs = specdec.generate_batch(target, ["def fib(n):", "def add(a, b):"], draft="qwen2.5-coder-0.5b:int8")

A :class:`BatchEngine` holds up to ``max_batch`` rows (sequences) in one batched cache per model
(:class:`~specdec.models.sessions.batch_session.BatchSession`: each row at its own length, its own mask). A round:

1. each row picks k_i: its gamma schedule's (0 for a plain row), at most the batch's gamma where two or more
   rows run (``speculation="measured"``, the default: Theorem 8 with the batch's measured verification cost,
   :class:`BatchGamma`, so rows draft fewer tokens, or none, as the batch grows);
2. the model draft proposes for all drafting rows in one pass per draft step (each row sampled with its
   own settings and random source); a parameter-free draft (prompt lookup, n-grams) proposes per row;
3. the target scores every row's pending token and drafts in one pass, and each row is verified on its
   own (``acceptance.verify``, Algorithm 1); one read-back brings every row's (n, tokens, betas). A row
   that just joined brings its last token's logits from its prefill and feeds its drafts only;
4. each row keeps its n_i accepted drafts and the target's token (ragged acceptance: rows advance by
   different amounts), rolls its caches back by bookkeeping, streams, and leaves when done; waiting
   requests join (continuous batching) before the next round.

Each row's output follows the target exactly: at temperature 0 the target's greedy tokens, at T > 0 its
distribution. Rows never see each other (their own cache row and mask). With the block-invariant int8
target (``quantize="int8"``) a row's logits are bit for bit those :func:`specdec.generate` gives it alone,
whatever shares the batch (its attention runs per sequence as in the one-sequence engine:
:func:`specdec.models.native.row_attention.exact_rows`): greedy rows give its tokens; a sampled row gives the
tokens it draws alone from the same seed where it drafts as it would alone (``speculation="rows"``; with the
default ``"measured"`` the batch decides how many tokens it drafts, and so which random numbers it draws: the same
distribution, other draws). In float precision they need not be: float matrix
products may depend on the batch, and this engine attends through a mask over a padded window where the
dynamic engine attends over the exact prefix, so a near-tie can break differently.

Structured output (a row's json_schema / regex / grammar) masks that row's target and draft logits, as in
:func:`specdec.generate`; the grammar's forced tokens draft for rows with a parameter-free drafter.

One engine at one row: while the batch holds one row (and none can join), that row's rounds are the
one-sequence engine's (:mod:`specdec.batch.alone`: its own session, the decoder step, the whole draft: a
hierarchy such as the 0.5B under prompt lookup, whose top model alone drafts for the batch's rows); its keys and
values move out of its slot and back when a request joins, so its tokens are what :func:`specdec.generate` gives.

Not batched (run one sequence at a time with :func:`specdec.generate`): drafts with another tokenizer,
encoder-decoder targets, beam search.
"""

from __future__ import annotations

import collections
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch

from specdec.acceptance import Verification, read_batch, verify
from specdec.batch.alone import release, rounds_alone
from specdec.batch.gate import DraftGate, gate_round
from specdec.batch.drafting import alone_draft, batch_drafting, propose_model
from specdec.batch.prefix import keep_prefix, prefix_cache
from specdec.batch.measuring import calibrate, report
from specdec.batch.speculation import SPECULATION, BatchGamma, draft_prefills, round_gammas, settle_alphas
from specdec.batch.prediction import propose_predictions
from specdec.batch.copying import propose_copies
from specdec.batch.fill import DEFAULT_CHUNK, chunk_size, drop_fill, fill, filled, follow_leave, start_fill
from specdec.batch.row import MODEL, PAD, BatchRow, make_row, row_context
from specdec.config import DEFAULT, GenerationConfig, default_gamma, preset_draft
from specdec.devices import RoundClock
from specdec.drafters.base import Draft
from specdec.drafters.plan import plan_draft
from specdec.errors import SpecDecError
from specdec.models import load
from specdec.models.sessions.batch_session import BatchSession
from specdec.rounds import Round, check_dead_end, with_carried
from specdec.run_state import RoundEvent, append_tokens, finish_output
from specdec.schedules import StepFeedback

__all__ = ["MODEL", "BatchRow", "BatchGamma", "BatchEngine", "batch_drafting", "batch_engine", "generate_batch"]

DEFAULT_POSITIONS = 4096  # max_positions when neither the caller nor the target's context says


class BatchEngine:
    """Continuous batching over ``target`` with an optional batched ``draft_model`` (a LanguageModel with the
    target's tokenizer). ``max_batch`` rows at most; each row holds at most ``max_positions`` positions
    (default: the target's context, else DEFAULT_POSITIONS). :meth:`add` queues a request; :meth:`step` lets
    waiting requests join, runs one round over every row, and returns the rows that finished."""

    def __init__(self, target: Any, draft_model: Any = None, max_batch: int = 8, max_positions: int | None = None,
                 gamma: int = 4, max_gamma: int = 12, alone_draft: Any = None, alone: bool = True,
                 prefix_cache_bytes: int = 0, speculation: str = "measured", prefill_chunk: int = DEFAULT_CHUNK):
        target = load(target)
        if target.is_encoder_decoder:
            raise SpecDecError("batched generation supports decoder-only targets; run an encoder-decoder target one "
                               "sequence at a time with specdec.generate")
        from specdec.decoding import check_target

        check_target(target)
        if max_batch < 1:
            raise SpecDecError(f"max_batch must be >= 1, got {max_batch}")
        self.target = target
        self.max_batch = max_batch
        self.max_positions = max_positions or min(target.max_context or DEFAULT_POSITIONS, DEFAULT_POSITIONS)
        capacity = self.max_positions + PAD
        self.target_session = BatchSession(target, max_batch, capacity)
        self.draft_model = draft_model
        self.draft_session = BatchSession(draft_model, max_batch, capacity) if draft_model is not None else None
        # the batch's only row runs through the one-sequence engine (specdec.batch.alone), its model-drafted rows
        # drafting with alone_draft there (what specdec.generate takes as draft=, over the engine's draft model:
        # the model alone, or a hierarchy under it); alone=False keeps every row in the batch
        self.alone = alone
        self.moves = {"alone": 0, "back": 0}  # a lone row out of the batch, and back in (tests and benchmarks)
        # how many tokens the model-drafted rows of a batch (two rows or more) draft: SPECULATION's
        if speculation not in SPECULATION:
            raise SpecDecError(f"speculation must be one of {', '.join(SPECULATION)}, got {speculation!r}")
        self.speculation = speculation
        self.gate = DraftGate() if speculation == "gate" else None
        # finished rows' keys and values for later requests that share their prefix (specdec.batch.prefix_cache): bit for
        # bit a fresh prefill's with a block-invariant target (kept for those, and not over a sliding window)
        self.prefix_cache = prefix_cache(target, prefix_cache_bytes)
        self.alone_plan = (plan_draft(alone_draft if alone_draft is not None else draft_model).load(target)
                           if draft_model is not None else None)
        # a joining prompt goes in prefill_chunk tokens a round while rows run (specdec.batch.fill; 0: in one pass)
        self.prefill_chunk = chunk_size(target, prefill_chunk)
        self.filling: BatchRow | None = None  # the row whose prompt is going in, in slot len(rows)
        self.fills: list[int] | None = None  # (tests: a list to record the prompt tokens fed per chunk)
        self.rows: list[BatchRow] = []  # row i lives in slot i of every session
        self.waiting: collections.deque[BatchRow] = collections.deque()
        self.clock = RoundClock(target.device)
        self.gamma_policy = BatchGamma(gamma, max_gamma)
        self.gamma_policy.packed = self.target_session.packed
        self.rounds = 0
        self.passes: list[tuple[int, int]] = []  # (rows, width) of each target pass, for tests and benchmarks

    @property
    def busy(self) -> bool:
        return bool(self.rows or self.waiting or self.filling)

    # -- rows joining and leaving -------------------------------------------------------------------
    def add(self, prompt_ids: Sequence[int], config: GenerationConfig | None = None, *, draft: Any = MODEL,
            on_tokens: Callable | None = None, on_round: Callable | None = None) -> BatchRow:
        """Queue a request (it joins at the next round with a free row). draft: MODEL (the engine's draft model),
        None (plain steps), or a parameter-free drafter name / object (one of its own)."""
        row = make_row(self, prompt_ids, config or GenerationConfig(), draft, on_tokens, on_round)
        self.waiting.append(row)
        return row

    def cancel(self, row: BatchRow, reason: str) -> None:
        """Stop ``row`` (waiting or running): it leaves before the next round."""
        row.cancelled = reason

    def _join(self) -> list[BatchRow]:
        """Waiting rows join while there is room; returns those cancelled while they waited (they never run)."""
        dropped = [row for row in self.waiting if row.cancelled]
        for row in dropped:
            self.waiting.remove(row)
            row.error = row.error or RuntimeError(row.cancelled)
        # with no row running the prompts go in at once; else at most one chunk of prompt tokens this round
        budget = None if not self.rows or not self.prefill_chunk else self.prefill_chunk
        while True:
            if self.filling is None:
                if not self.waiting or len(self.rows) >= self.max_batch:
                    break
                start_fill(self, self.waiting.popleft())
            if self.filling.cancelled:
                row = drop_fill(self)
                row.error = row.error or RuntimeError(row.cancelled)
                dropped.append(row)
                continue
            if budget is not None and budget <= 0:
                break
            fed = fill(self, budget)
            budget = None if budget is None else budget - fed
            if not filled(self):
                break
            row, self.filling = self.filling, None
            if row.draft is not None and row.draft != MODEL:
                row.draft.start(row_context(row))
            if row.prediction is not None:
                row.prediction.start(row_context(row))
            self.rows.append(row)
        return dropped

    def _leave(self, slot: int) -> None:
        """Row ``slot`` leaves; the last row moves into its slot."""
        last = len(self.rows) - 1
        keep_prefix(self, slot, self.rows[slot])  # (before its caches are given back or overwritten)
        self.target_session.move(last, slot)
        if self.draft_session is not None:
            self.draft_session.move(last, slot)
        row = self.rows[slot]
        if row.output is not None:  # (finished, not cancelled: how long requests run, for the draft's prefills)
            self.gamma_policy.finished(len(row.output.token_ids))
        self.rows[slot] = self.rows[last]
        self.rows.pop()
        follow_leave(self)  # (a row filling its prompt in the next free slot moves down with it)
        release(row)
        if row.draft is not None and row.draft != MODEL:
            row.draft.close()

    # -- one round ----------------------------------------------------------------------------------
    def _gammas(self) -> list[int]:
        return round_gammas(self)

    def calibrate(self, context: int = 128, widths: Sequence[int] = (1, 2, 3, 5)) -> dict:
        """Time the batch's passes and draft steps, seeding its gamma policy (:func:`.measuring.calibrate`)."""
        return calibrate(self, context, widths)

    def report(self) -> dict:
        """How the batch speculates, measured (:func:`~specdec.batch.measuring.report`)."""
        return report(self)

    def soon(self) -> int:
        """The rows the batch holds once the requests waiting (and the one filling) have joined, at most max_batch."""
        return min(self.max_batch, len(self.rows) + len(self.waiting) + (self.filling is not None))

    def draft_prefills(self, rows: int) -> bool:
        """Whether a model-drafted row joining a batch of ``rows`` rows has its draft fed its prompt as it goes in
        (:func:`~specdec.batch.speculation.draft_prefills`)."""
        return draft_prefills(self, rows)

    def step(self) -> list[BatchRow]:
        """Let waiting requests join, run one round over every row (a lone request's prompt that went in at once has
        its first round next step); returns the rows that finished (``output`` set, or ``error``: a callback raised,
        a cancel)."""
        was_empty = not self.rows
        finished = [row for row in self.rows if row.cancelled]  # (they leave first: a waiting request takes the slot)
        for row in finished:
            row.error = row.error or RuntimeError(row.cancelled)
        self._drop(finished)
        finished = self._join() + finished
        if not self.rows:
            return finished
        if was_empty and len(self.rows) == 1 and self.alone and self.rows[0].draft == MODEL:
            # a lone request's prompt went in at once: requests that arrived meanwhile (a server's clients sending
            # together) join before its first round decides whether it goes alone (its 0.5B fed for nothing)
            return finished
        done = rounds_alone(self)  # one row: through the one-sequence engine
        if done is not None:
            return finished + done
        rows, device = self.rows, self.target.device
        ks, predicted = propose_predictions(rows, self._gammas())  # {row: its prediction's draft}, those rows' k 0
        ks, copied = propose_copies(self, rows, ks, predicted)  # {row: its copy from its context}, those rows' k 0
        ks, gated = gate_round(self.gate if self.draft_session is not None else None, rows, ks)
        t0 = self.clock.mark()
        calls_before = self.draft_session.forward_passes if self.draft_session is not None else 0
        drafting = self.draft_session is not None and any(row.draft == MODEL and k > 0 for row, k in zip(rows, ks))
        drafts, caught_up = (propose_model(self.draft_session, rows, ks, self.target.vocab_size, device, self.clock,
                                           self.gamma_policy)
                             if drafting else ([Draft.empty(device) for _ in rows], 0.0))
        for i, row in enumerate(rows):
            if row.draft is not None and row.draft != MODEL and ks[i] > 0:
                drafts[i] = row.draft.propose(row.sequence, ks[i])
            drafts[i] = predicted.get(i, copied.get(i, drafts[i]))
            if row.constraint is not None:  # cut at the first refused token, q masked (specdec.constraints)
                drafts[i] = row.constraint.admit(drafts[i], 0)
        t1 = self.clock.mark()
        # per row: its last token (the target's cache lacks it) and its drafts; a row that joined this round
        # brings its last position's logits from its prefill, and feeds its drafts only (a plain one: nothing)
        feeds = [d.tokens if row.carried is not None else torch.cat([row.ids[len(row.sequence) - 1: len(row.sequence)],
                                                                     d.tokens]) for row, d in zip(rows, drafts)]
        wanted = [len(f) for f in feeds]
        width = max(wanted)
        fed = self.target_session.extend(feeds, wanted) if width else [None] * len(rows)  # [m_i, V] per row
        logits = [with_carried(row.carried, lg) for lg, row in zip(fed, rows)]  # [g_i + 1, V] per row
        logits = [lg if row.constraint is None else row.constraint.restrict(lg, 0) for lg, row in zip(logits, rows)]
        carried = [row.carried is not None for row in rows]
        for row in rows:
            row.carried = None
        results: list[Verification] = [
            verify(lg, d.tokens, d.q, row.config.sampling, row.generator, row.config.lenience, row.config.verification)
            for lg, d, row in zip(logits, drafts, rows)]
        t2 = self.clock.mark()
        read = read_batch(results, [d.tokens for d in drafts] if any(r.on_round for r in rows) else None)
        time_draft, time_verify = self.clock.seconds(t0, t1), self.clock.seconds(t1, t2)
        self.rounds += 1
        draft_calls = (self.draft_session.forward_passes - calls_before) if self.draft_session is not None else 0
        if width:  # (no pass when every row's logits came from its prefill)
            self.passes.append((len(rows), width))
            stepped = max((len(d) for i, (row, d) in enumerate(zip(rows, drafts))
                           if row.draft == MODEL and i not in predicted and i not in copied), default=0)
            self.gamma_policy.observe(len(rows), width, time_verify, stepped,  # (the draft model's steps)
                                      time_draft - caught_up,  # (a catch-up is no draft step)
                                      tokens=self.target_session.last_pass_tokens)
            if self.speculation == "measured" and self.draft_session is not None and not predicted:
                # what the round gave, whole: drafting (the model, copies) or plain (BatchGamma.vetoes)
                self.gamma_policy.observe_round(len(rows), stepped > 0 or bool(copied), sum(len(r[0]) for r in read),
                                                time_draft + time_verify)
        done = []

        for i, row in enumerate(rows):
            new, n, betas, drafted_ids = read[i]
            refused = row.constraint is not None and row.constraint.settle(0, new) < len(new)
            new = new[:n] if refused else new  # the grammar was complete and allowed nothing, not even EOS
            self.target_session.rollback(i, len(row.sequence) + n)  # the sequence + accepted drafts
            if row.draft == MODEL and i not in copied:  # (a copy's acceptance is read off what rounds wrote)
                row.alpha.observe(betas)  # (the batch's gamma reads it)
            if row.draft == MODEL and row.proposed is not None:
                length, k = row.proposed
                self.draft_session.rollback(i, length + min(n, max(k - 1, 0)))
                row.proposed = None
            elif row.draft is not None and row.draft != MODEL and i not in predicted:
                row.draft.update(n)
            if row.prediction is not None:
                row.prediction.update(n)  # (a round it did not propose: nothing)
            r = Round(drafts[i], results[i], new, n, betas, draft_calls if row.draft == MODEL else 0, time_draft,
                      time_verify)
            row.stats.record_round(r)
            # (a row fed nothing measured no step; a copy's betas are not its draft's: its schedule keeps the model's)
            if row.draft is not None and (not carried[i] or r.drafted) and i not in copied:
                row.schedule.update(StepFeedback(r.drafted, n, betas, time_draft, time_verify, len(feeds[i])))
            length = len(row.sequence)
            row.ids[length: length + n + 1] = results[i].tokens[: n + 1]
            try:
                if row.constraint is not None:
                    row.constraint.commit()
                    check_dead_end(row, new)
                added = append_tokens(row, new, [True] * n + [False])
                if row.constraint is not None and not row.stats.stop_reason and (refused or row.constraint.finished):
                    row.stats.stop_reason = "constraint"
                if row.on_round is not None:
                    row.on_round(RoundEvent(drafted_ids, n, added, row.from_draft[len(row.from_draft) - len(added):],
                                            drafts[i].source))
            except Exception as err:  # the row's consumer failed or left (serve: Cancelled): only this row ends
                row.error = err
            if row.error is not None or row.stats.stop_reason:
                done.append(row)
        model_drafted = [row.draft == MODEL and len(d) > 0 and i not in copied and i not in predicted
                         for i, (row, d) in enumerate(zip(rows, drafts))]
        settle_alphas(self.gamma_policy, rows, model_drafted, [r[2] for r in read])  # (betas)
        for row in done:
            if row.error is None:
                row.output = finish_output(row)
                row.output.stats.prediction = row.prediction.report() if row.prediction is not None else {}
        if gated is not None:
            gated()  # the round's tokens and time, to the gate
        self._drop(done)
        return finished + done

    def _drop(self, rows: list[BatchRow]) -> None:
        for row in rows:
            if row in self.rows:
                self._leave(self.rows.index(row))

    def run(self) -> None:
        """Step until every request (running or waiting) is done."""
        while self.busy:
            self.step()


def batch_engine(target: Any, draft: Any, configs: Sequence[GenerationConfig], max_batch: int,
                 max_positions: int | None = None, speculation: str = "measured") -> tuple[BatchEngine, Any]:
    """A :class:`BatchEngine` for rows with these configs, and what each row drafts with (``draft=`` of
    :meth:`BatchEngine.add`): the engine's draft model, a parameter-free drafter name, or None (plain)."""
    plan_draft(draft).check()
    target = load(target)
    model, row_draft = batch_drafting(target, draft)
    engine = BatchEngine(target, model, max_batch, max_positions, gamma=max(c.gamma for c in configs),
                         max_gamma=max(c.gamma_bound for c in configs), alone_draft=alone_draft(draft, model),
                         speculation=speculation)
    return engine, row_draft


def generate_batch(target: Any, prompts: Sequence[str | Sequence[int]], *, draft: Any = DEFAULT,
                   config: GenerationConfig | None = None, configs: Sequence[GenerationConfig] | None = None,
                   max_batch: int | None = None, max_positions: int | None = None, speculation: str = "measured",
                   **options: Any) -> list[Any]:
    """Generate a continuation of each prompt, all rows in one batched pass per round; one
    :class:`~specdec.decoding.GenerationOutput` per prompt, in order, each what :func:`specdec.generate` gives it alone.

    draft: None (plain), one model with the target's tokenizer (loaded, a preset name, ``"name:int8"``), a
      hierarchy over one (its top model drafts for the batch's rows, all of it for a lone row), or a parameter-free
      drafter name (each row gets its own); left to the default, :func:`specdec.config.preset_draft` (plain for others).
    config / options: the settings of every row (a :class:`GenerationConfig` or its fields as keywords; the default
      draft's gamma on this device where none is given); configs: one per prompt instead (each its own settings).
    max_batch: rows at once (default: all prompts); further prompts join as rows finish. speculation: how many
      tokens the model-drafted rows draft while two or more rows run: "measured" (the default), "gate" or "rows".
    """
    if configs is not None and (config is not None or options):
        raise SpecDecError("pass either configs= (one per prompt) or config= / keyword options, not both")
    gamma_given = configs is not None or config is not None or options.get("gamma") is not None
    if configs is None:
        one = config if config is not None else GenerationConfig.from_options(**options)
        configs = [one] * len(prompts)
    elif options:
        raise SpecDecError("pass either config= or keyword options, not both")
    if len(configs) != len(prompts):
        raise SpecDecError(f"configs= has {len(configs)} entries for {len(prompts)} prompts; give one per prompt")
    if not prompts:
        return []
    if isinstance(draft, str) and draft == DEFAULT:
        target = load(target)
        draft = preset_draft(target)
        if draft is not None and not gamma_given:  # the default draft's gamma on this device
            configs = [replace(configs[0], gamma=default_gamma(target.device))] * len(prompts)
    engine, row_draft = batch_engine(target, draft, configs, max_batch or len(prompts), max_positions, speculation)
    target = engine.target
    from specdec.decoding import prompt_token_ids

    rows = [engine.add(prompt_token_ids(target, p, c), c, draft=row_draft) for p, c in zip(prompts, configs)]
    engine.run()
    for row in rows:
        if row.error is not None:
            raise row.error
    return [row.output for row in rows]
