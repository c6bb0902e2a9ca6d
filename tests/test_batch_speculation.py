"""How much a batch's rows draft (specdec.batch.engine, speculation="measured", the default): Theorem 8 over the
batch's measured costs caps every model-drafted row's gamma, so rows draft fewer tokens, or none, as the batch grows;
where it drafts nothing a joining row's draft is not prefilled, and catches up once the batch drafts again."""

from types import SimpleNamespace

import pytest

import specdec
from specdec.batch.engine import MODEL, BatchEngine, BatchGamma
from specdec.batch.speculation import FEED_MARGIN, REALIZED_RETRY, REALIZED_ROUNDS, settle_alphas
from specdec.config import GenerationConfig
from specdec.errors import SpecDecError
from specdec.schedules import AlphaEstimate, DecayedTimes
from test_batch_alone import quantized_pair
from test_batching import PROMPTS, quantizations


def flat_then_linear(n: int) -> float:
    """A CPU's batched pass: bound by reading the weights up to 8 tokens (60 ms), then 8 ms a token more."""
    return 0.060 + 0.008 * max(n - 8, 0)


def test_the_pass_time_is_read_piecewise_between_measured_sizes():
    times = DecayedTimes()
    assert times.at(4) is None  # nothing to read before two sizes
    for n in (1, 8, 16, 40):
        times.observe(n, flat_then_linear(n))
    assert times.at(1) == times.at(0) == pytest.approx(0.060)  # below the smallest: its time
    assert times.at(5) == pytest.approx(0.060) and times.at(12) == pytest.approx(flat_then_linear(12))
    assert times.at(24) == pytest.approx(flat_then_linear(24))  # between 16 and 40
    assert times.at(64) == pytest.approx(flat_then_linear(64))  # past the largest: the last slope


def test_the_batch_gamma_follows_a_pass_time_that_is_flat_then_grows():
    """Theorem 8 with the batch's pass: one row of alpha 0.8 drafts 4 (its optimum when a pass of up to 8 tokens
    costs what one token does), eight rows draft none (8 rows x 2 tokens cost 2.1 plain passes for 1.8 tokens a
    row). A least-squares line through the same points (the old reading) has a pass's time grow from its first
    token, and drafted 1 at one row."""
    policy = BatchGamma(gamma=4, max_gamma=12)
    for rows, width in ((1, 1), (1, 5), (8, 1), (2, 1), (2, 8), (8, 5)):
        policy.observe(rows, width, flat_then_linear(rows * width), 4, 4 * 0.012)
        policy.observe(rows, width, flat_then_linear(rows * width), 4, 4 * 0.012)  # (a round after a drafting one)
    assert policy.choose([0.8]) == 4
    assert policy.choose([0.8] * 8) == 0 and policy.decided == {1: 4, 8: 0} and not policy.drafts_at(8)
    assert policy.choose([0.8] * 2) == 3 and policy.drafts_at(2)  # 2 x 4 tokens: still one flat pass
    assert policy.choose([0.8], max_gamma=3) == 3  # at most the rows' own gamma
    assert policy.choose([0.8] * 4) == 0 and 4 not in policy.decided  # 4 rows: plain decoding's pass timed first
    policy.observe(4, 1, flat_then_linear(4), 0, 0.0)
    # 4 x 2 tokens: one flat pass
    assert [policy.choose([0.8] * 4) for _ in range(policy.probe_every)] == [1] * policy.probe_every
    assert policy.choose([0.8] * 4) == 0  # and again every probe_every rounds at that batch size


class ScriptedGamma(BatchGamma):
    """The batch's gamma as a script says per batch size (the engine's wiring, apart from measured times)."""

    def __init__(self, by_rows, **kwargs):
        super().__init__(**kwargs)
        self.by_rows, self.asked = by_rows, []

    def choose(self, alphas, rows=None, max_gamma=None):
        self.asked.append((len(alphas), rows, max_gamma))
        best = min(self.by_rows(rows), max_gamma)
        self.decided[rows] = best
        return best


@pytest.mark.parametrize("method", quantizations())
def test_rows_draft_at_most_the_batch_gamma_and_a_late_draft_catches_up(method):
    """Three rows draft nothing (the batch's gamma 0 there), two rows at most 2, a lone row its own gamma: greedy
    rows still give specdec.generate's tokens; a row that joined a batch of three had no draft prefill, and drafts
    once the batch is down to two (its draft caught up with its prompt and the tokens since), unless it has too few
    tokens left to pay for that catch-up."""
    target, draft = quantized_pair("llama", method)
    engine = BatchEngine(target, draft, max_batch=3)
    engine.gamma_policy = ScriptedGamma(lambda rows: 0 if rows >= 3 else 2, gamma=4, max_gamma=8)
    configs = [GenerationConfig(max_new_tokens=n, gamma=g) for n, g in ((20, 4), (6, 3), (14, 1), (120, 4), (10, 4))]
    prompts = [(PROMPTS[i] * 12)[:90] for i in range(5)]  # long enough that a late draft is far behind (> CATCH_UP)
    rows = [engine.add(p, c) for p, c in zip(prompts, configs)]
    widths = []
    while engine.busy:
        before = len(engine.passes)
        engine.step()
        widths += engine.passes[before:]
    alone = [specdec.generate(target, p, draft=draft, config=c) for p, c in zip(prompts, configs)]
    assert [r.output.token_ids for r in rows] == [a.token_ids for a in alone]
    assert all(w == 1 for b, w in widths if b == 3)  # three rows: plain passes
    assert any(w == 3 for b, w in widths if b == 2) and all(w <= 3 for b, w in widths if b == 2)  # k <= 2
    assert (3, 3, 4) in engine.gamma_policy.asked  # three model rows, the widest own gamma 4
    assert not rows[3].fill_draft and rows[3].output.stats.drafted > 0  # no draft prefill at 3 rows, drafted later
    assert not rows[4].fill_draft and rows[4].output.stats.drafted == 0  # too few tokens left to pay its catch-up


def test_a_sampled_row_draws_what_it_draws_alone_with_speculation_rows():
    target, draft = quantized_pair("llama", "int8")
    configs = [GenerationConfig(max_new_tokens=12, gamma=3, temperature=1.0, seed=i) for i in range(3)]
    outs = specdec.generate_batch(target, PROMPTS[:3], draft=draft, configs=configs, speculation="rows")
    assert [o.token_ids for o in outs] == [specdec.generate(target, p, draft=draft, config=c).token_ids
                                           for p, c in zip(PROMPTS[:3], configs)]


def test_an_unknown_speculation_is_a_clear_error():
    target, draft = quantized_pair("llama", "int8")
    with pytest.raises(SpecDecError, match="speculation must be one of measured, gate, rows, got 'always'"):
        BatchEngine(target, draft, speculation="always")


def planted_policy(feed_seconds: float, step: float = 0.012) -> BatchGamma:
    """A batch policy with flat_then_linear passes, a draft step of ``step`` seconds at any batch size, and the draft
    fed at ``feed_seconds`` a token."""
    policy = BatchGamma(gamma=4, max_gamma=12)
    for tokens in (1, 2, 8, 16, 40):
        policy.target_time.observe(tokens, flat_then_linear(tokens))
    for rows in (1, 2, 4, 8):
        policy.draft_time.observe(rows, step)
    policy.observe_feed(100, 100 * feed_seconds)
    return policy


def without_copies(monkeypatch) -> None:
    """Batch rows do not copy from their context (copies need no draft model and would count as its drafts)."""
    from specdec.batch import engine as engine_module

    monkeypatch.setattr(engine_module, "propose_copies", lambda engine, rows, ks, skip: (ks, {}))


def planted_engine(target, draft, feed_seconds: float, **kwargs) -> BatchEngine:
    """A batch engine deciding from :func:`planted_policy`'s costs."""
    engine = BatchEngine(target, draft, **kwargs)
    engine.gamma_policy = planted_policy(feed_seconds)
    engine.gamma_policy.packed = engine.target_session.packed
    return engine


def test_feeding_a_draft_pays_only_for_enough_tokens_to_come():
    """At 2 rows of alpha 0.8 (the planted costs: plain 33 tokens/s, gamma 3 about 61) drafting saves about 14 ms a
    token: a 340-token prompt fed at 3 ms a token (1.0 s, twice that with FEED_MARGIN) pays for 200 tokens to come
    (half of a 400-token limit before any request finished), not for 96 (of 192: a 200-token prompt's feed does),
    nor for the 70 that finished requests generated; a 100-token prompt pays for those 70; a row 60 tokens into a
    request of a 70-token mean still counts a quarter of it (17 tokens)."""
    assert BatchGamma(gamma=4, max_gamma=12).feed_pays(2, 340, 192) is None  # nothing timed: the caller's rule
    policy = planted_policy(0.003)
    # no request finished yet: half the row's limit (COLD_OUTPUT_SHARE), 96 of 192
    assert policy.tokens_left(192, 0) == 96 and policy.tokens_left(192, 100) == 96
    assert policy.feed_pays(2, 340, 192) is False and policy.feed_pays(2, 200, 192) is True
    assert policy.feed_pays(2, 340, 400) is True
    for _ in range(3):
        policy.finished(70)
    assert policy.output_tokens == pytest.approx(70)
    assert policy.feed_pays(2, 340, 192) is False and policy.feed_pays(2, 100, 192) is True
    assert policy.feed_pays(2, 100, 30) is False  # at most the tokens the row may still generate
    assert policy.feed_pays(2, 30, 192, generated=60) is True and policy.feed_pays(2, 60, 192, generated=60) is False
    policy.pooled = AlphaEstimate(0.1)  # a draft the target rejects: the batch would not draft, so nothing pays
    assert policy.feed_pays(2, 1, 192) is False


def test_an_alpha_left_low_by_rejections_ages_toward_the_batch_pooled_one():
    """A row whose estimate two rejected rounds left at 0.24 keeps a batch of two plain (the planted costs, a 30 ms
    draft step: rows of 0.8 and below 0.6 draft nothing) while it drafts nothing; rounds in which it proposes
    nothing age it toward the pooled alpha, and the batch drafts again. A round in which a row drafted feeds the
    pooled alpha instead."""
    policy = planted_policy(0.003, step=0.030)
    low = AlphaEstimate(0.8)
    for _ in range(2):
        low.observe([0.0])
    assert low.value < 0.3
    assert policy.choose([0.8, low.value], 2) == 0  # (plain's pass at 2 rows is timed first)
    assert policy.choose([0.8, low.value], 2) == 0
    rows = [SimpleNamespace(draft=MODEL, alpha=AlphaEstimate(0.8), schedule=None),
            SimpleNamespace(draft=MODEL, alpha=low, schedule=policy.row())]
    rows[1].schedule._alpha = AlphaEstimate(low.value)
    rounds = 0
    while policy.choose([0.8, rows[1].alpha.value], 2) == 0:
        settle_alphas(policy, rows, [True, False], [[1.0, 1.0], []])
        rounds += 1
        assert rounds < 60
    assert rows[1].alpha.value > 0.5 and rows[1].schedule.alpha > 0.5  # (the adaptive schedule's estimate aged too)
    assert policy.pooled.value > 0.8  # the drafting row's accepted betas


@pytest.mark.parametrize("method", quantizations())
def test_a_joining_row_whose_draft_feeding_does_not_pay_runs_plain_with_its_tokens(monkeypatch, method):
    """Where feeding the draft a prompt costs more than drafting saves (a planted 10 s a token), a row joining a
    batch that holds a row has no draft prefill and drafts nothing, while the row that joined the empty batch
    (fed, as a lone row drafts) drafts; where feeding is cheap both are fed. Greedy rows give specdec.generate's
    tokens either way. (Copying first is off here: its copies need no draft model and would count as drafts.)"""
    without_copies(monkeypatch)
    target, draft = quantized_pair("llama", method)
    configs = [GenerationConfig(max_new_tokens=n, gamma=3) for n in (24, 20)]
    prompts = [(PROMPTS[i] * 12)[:90] for i in range(2)]
    alone = [specdec.generate(target, p, draft=draft, config=c).token_ids for p, c in zip(prompts, configs)]
    for feed, fed in ((10.0, [True, False]), (1e-6, [True, True])):
        engine = planted_engine(target, draft, feed, max_batch=2, alone=False)
        rows = []
        for p, c in zip(prompts, configs):  # (one at a time: the second joins a batch of one)
            rows.append(engine.add(p, c))
            engine.step()
        engine.run()
        assert [r.output.token_ids for r in rows] == alone
        assert [r.fill_draft for r in rows] == fed
        assert rows[0].output.stats.drafted > 0 and (rows[1].output.stats.drafted > 0) == fed[1]


@pytest.mark.parametrize("method", quantizations())
def test_requests_arriving_together_feed_their_drafts_only_where_it_pays(method):
    """Two requests waiting as the batch starts go in at once: the first joins an empty batch but runs beside the
    second, so its draft's feed is weighed as the second's (where it does not pay, neither is fed; where it is
    cheap, both). Greedy rows give specdec.generate's tokens either way."""
    target, draft = quantized_pair("llama", method)
    configs = [GenerationConfig(max_new_tokens=n, gamma=3) for n in (24, 20)]
    prompts = [(PROMPTS[i] * 12)[:90] for i in range(2)]
    alone = [specdec.generate(target, p, draft=draft, config=c).token_ids for p, c in zip(prompts, configs)]
    for feed, fed in ((10.0, [False, False]), (1e-6, [True, True])):
        engine = planted_engine(target, draft, feed, max_batch=2)
        rows = [engine.add(p, c) for p, c in zip(prompts, configs)]
        engine.run()
        assert [r.output.token_ids for r in rows] == alone
        assert [r.fill_draft for r in rows] == fed


@pytest.mark.parametrize("method", quantizations())
def test_a_request_arriving_while_the_first_prompt_goes_in_joins_before_its_first_round(method):
    """A server's clients sending together: the first request's prompt goes in alone (a step of its own, no round),
    the second arrives meanwhile and joins before the first row's first round, so the first row never goes alone
    and its draft model is never fed its prompt where feeding does not pay (planted: 10 s a token). Tokens as
    specdec.generate's."""
    target, draft = quantized_pair("llama", method)
    configs = [GenerationConfig(max_new_tokens=n, gamma=3) for n in (24, 20)]
    prompts = [(PROMPTS[i] * 12)[:90] for i in range(2)]
    engine = planted_engine(target, draft, 10.0, max_batch=2)
    rows = [engine.add(prompts[0], configs[0])]
    engine.step()
    assert rows[0] in engine.rows and len(rows[0].sequence) == len(prompts[0]) and not rows[0].alone  # no round yet
    rows.append(engine.add(prompts[1], configs[1]))
    engine.step()  # the second prompt goes in (one chunk), a round of both
    assert len(engine.rows) == 2 and engine.moves["alone"] == 0 and not any(r.fill_draft for r in rows)
    engine.run()
    assert [r.output.token_ids for r in rows] == [specdec.generate(target, p, draft=draft, config=c).token_ids
                                                  for p, c in zip(prompts, configs)]


@pytest.mark.parametrize("method", quantizations())
def test_a_lone_row_whose_draft_was_not_fed_waits_in_the_batch_while_a_prompt_goes_in(monkeypatch, method):
    """The batch's only row, its draft never fed, stays in the batch while the next request's prompt goes in (chunks
    of 8 tokens) rather than go alone and have its draft fed the whole sequence for those few rounds; alone once
    nothing fills. Its tokens are specdec.generate's."""
    from specdec.batch import alone as alone_module

    target, draft = quantized_pair("llama", method)
    seen = []
    real = alone_module.waits_in_batch
    monkeypatch.setattr(alone_module, "waits_in_batch", lambda engine, row: seen.append(real(engine, row)) or seen[-1])
    configs = [GenerationConfig(max_new_tokens=n, gamma=3) for n in (60, 90, 6)]  # (row 0 leaves before row 1)
    prompts = [(PROMPTS[i] * 12)[:90] for i in range(3)]
    engine = planted_engine(target, draft, 10.0, max_batch=2, prefill_chunk=8)
    rows = [engine.add(prompts[0], configs[0])]
    engine.step()  # the first row joins the empty batch and goes on alone (its batch draft not fed)
    rows += [engine.add(p, c) for p, c in zip(prompts[1:], configs[1:])]
    engine.run()
    assert [r.output.token_ids for r in rows] == [specdec.generate(target, p, draft=draft, config=c).token_ids
                                                  for p, c in zip(prompts, configs)]
    assert not rows[0].fill_draft and not rows[1].fill_draft
    assert True in seen  # a lone row waited in the batch while the next prompt went in (row 0, then row 1)


def test_drafting_rounds_that_gave_less_than_plain_overrule_theorem_8():
    """At 3 rows of alpha 0.8 the planted costs say gamma > 0 pays; drafting rounds that gave 40 tokens a second
    (whole rounds: draft steps, catch-ups, the pass) against a plain pass's 50 (3 tokens in the timed 60 ms) stop it
    after REALIZED_ROUNDS of them, until REALIZED_RETRY plain rounds later drafting is tried afresh. Rounds that gave
    more than plain keep it drafting."""
    alphas = [0.8] * 3
    for rate, keeps in ((40.0, False), (60.0, True)):
        policy = planted_policy(0.003)
        policy.target_time.observe(3, flat_then_linear(3))  # (plain's pass at 3 rows timed: choose decides there)
        assert policy.choose(alphas, 3) > 0
        for _ in range(REALIZED_ROUNDS - 1):
            policy.observe_round(3, True, 6, 6 / rate)
        assert policy.choose(alphas, 3) > 0 and not policy.vetoes(3)  # (too few rounds to tell)
        policy.observe_round(3, True, 6, 6 / rate)
        assert (policy.choose(alphas, 3) > 0) == keeps and (policy.decided[3] > 0) == keeps
        assert policy.vetoes(3) != keeps and policy.realized(3, True) == pytest.approx(rate)
    policy = planted_policy(0.003)
    policy.target_time.observe(3, flat_then_linear(3))
    for _ in range(REALIZED_ROUNDS):
        policy.observe_round(3, True, 6, 0.15)
    for _ in range(REALIZED_RETRY - 1):
        policy.observe_round(3, False, 3, 3 / 45.0)  # plain rounds measured whole: 45 tokens a second, more
        assert policy.vetoes(3) and policy.choose(alphas, 3) == 0
    policy.observe_round(3, False, 3, 3 / 45.0)
    assert not policy.vetoes(3) and policy.realized(3, True) is None  # tried afresh: the old rounds forgotten
    assert policy.choose(alphas, 3) > 0 or policy.choose(alphas, 3) > 0  # (one of two may be choose's own probe)


@pytest.mark.parametrize("method", quantizations())
def test_a_batchs_last_row_whose_draft_catch_up_does_not_pay_stays_in_the_batch(method):
    """Two requests arriving together, their drafts not fed (planted: 10 s a token); the first ends first, and the
    second, its draft far behind and too few tokens left to pay its catch-up, goes on in the batch (plain and copying
    rounds) rather than alone; where feeding is cheap it goes alone. Tokens as specdec.generate's either way."""
    target, draft = quantized_pair("llama", method)
    configs = [GenerationConfig(max_new_tokens=n, gamma=3) for n in (4, 30)]
    prompts = [(PROMPTS[i] * 12)[:90] for i in range(2)]  # (the second's 85 tokens: more than CATCH_UP behind)
    alone = [specdec.generate(target, p, draft=draft, config=c).token_ids for p, c in zip(prompts, configs)]
    for feed, moved in ((10.0, False), (1e-6, True)):
        engine = planted_engine(target, draft, feed, max_batch=2)
        rows = [engine.add(p, c) for p, c in zip(prompts, configs)]
        engine.run()
        assert [r.output.token_ids for r in rows] == alone
        assert (engine.moves["alone"] > 0) == moved


@pytest.mark.parametrize("method", quantizations())
def test_a_row_kept_in_the_batch_for_a_joining_prompt_does_not_catch_its_draft_up_meanwhile(monkeypatch, method):
    """Two requests arriving together, their drafts not fed (planted 8 ms a token: at 2 rows feeding 100 tokens does
    not pay for 100 to come); one ends and a third request's prompt goes in 8 tokens a round, the feed now planted
    where catching the other's draft up would pay at 1 row but not at 2.
    The row left alone stays in the batch for those rounds (it joins the third) and its draft is not caught up for
    them either: its feed is weighed at the rows the batch is about to hold (fails where it was weighed at one row).
    Tokens as specdec.generate's. (Copying first is off: its copies would draft for it without the model.)"""
    without_copies(monkeypatch)
    target, draft = quantized_pair("llama", method)
    configs = [GenerationConfig(max_new_tokens=n, gamma=3) for n in (6, 100, 100)]
    prompts = [(PROMPTS[i] * 60)[:100] for i in range(3)]
    engine = planted_engine(target, draft, 0.008, max_batch=2, prefill_chunk=8)
    for _ in range(20):
        engine.gamma_policy.finished(100)  # (planted: requests run 100 tokens)
    rows = [engine.add(p, c) for p, c in zip(prompts[:2], configs[:2])]
    while rows[0].output is None:
        engine.step()
    assert engine.rows == [rows[1]] and not any(r.fill_draft for r in rows)
    # the draft's feed planted between what drafting saves a token at 1 row and at 2 (the rounds' own times moved
    # the planted pass table): catching the row's draft up pays at 1 row, not at 2
    policy, row = engine.gamma_policy, rows[1]
    generated = len(row.sequence) - row.start_len
    gap, left = len(row.sequence), policy.tokens_left(row.limit - generated, generated)
    policy.feed_seconds = left * (policy.feed_saving(1) * policy.feed_saving(2)) ** 0.5 / (FEED_MARGIN * gap)
    assert policy.feed_pays(1, gap, row.limit - generated, generated)
    assert not policy.feed_pays(2, gap, row.limit - generated, generated)
    rows.append(engine.add(prompts[2], configs[2]))
    fed_waiting = []
    real = engine.draft_session.prefill

    def prefill(slot, ids, start=0):
        if engine.filling is not None and len(engine.rows) == 1:
            fed_waiting.append(len(ids) - start)
        return real(slot, ids, start)

    engine.draft_session.prefill = prefill
    engine.step()
    assert engine.filling is rows[2] and engine.rows == [rows[1]]  # (the third's prompt goes in over rounds)
    while engine.filling is not None:
        assert not rows[1].alone
        engine.step()
    engine.run()
    assert fed_waiting == []
    assert [r.output.token_ids for r in rows] == [specdec.generate(target, p, draft=draft, config=c).token_ids
                                                  for p, c in zip(prompts, configs)]


def test_calibrate_times_the_drafts_feed_as_a_warm_server_pays_it(monkeypatch):
    """The feed cost calibrate seeds (what a prompt token fed to the draft costs: BatchGamma.feed_pays) is the best of
    its timed prefills, so the one-off costs of the draft's first passes do not set it: a first prefill that takes a
    second longer leaves the seed at the later ones' time; the draft's cache is left empty for requests."""
    import time

    from specdec.batch.measuring import FEED_TIMINGS

    target, draft = quantized_pair("llama", "int8")
    engine = BatchEngine(target, draft, max_batch=2)
    session, calls = engine.draft_session, []
    prefill = session.prefill

    def slow_first(slot, ids):
        calls.append(len(ids))
        if len(calls) == 1:
            time.sleep(1.0)
        return prefill(slot, ids)

    monkeypatch.setattr(session, "prefill", slow_first)
    engine.calibrate(context=40)
    assert calls == [40] * FEED_TIMINGS and FEED_TIMINGS >= 2
    assert engine.gamma_policy.feed_seconds < 0.5 / 40  # not the slow first pass's > 1 s / 40 tokens
    assert all(length == 0 for length in session.lengths)
    config = GenerationConfig(max_new_tokens=12, gamma=3)
    row = engine.add(PROMPTS[0], config)
    engine.run()
    assert row.output.token_ids == specdec.generate(target, PROMPTS[0], draft=draft, config=config).token_ids
