"""One engine at one row (specdec.batch.alone): a batch's only row runs through the one-sequence engine, and goes
back into the batch when a request joins, its keys and values copied each way: with a block-invariant target the
row's tokens are bit for bit specdec.generate's, however often it moves."""

import dataclasses

import pytest
import torch

import specdec
from specdec.batch.engine import BatchEngine, alone_draft
from specdec.config import GenerationConfig
from specdec.drafters import hierarchical
from specdec.drafters.plan import plan_draft
from specdec.models.sessions.batch_session import BatchSession
from test_batching import PROMPTS, quantizations
from test_quantize import quantized_copy
from tiny import load_tiny, load_tiny_chars, perturbed, tiny_gemma3


def quantized_pair(kind: str, method: str):
    base = load_tiny(eos=None, hidden=128) if kind == "llama" else tiny_gemma3(sliding_window=6, eos=None)
    return quantized_copy(base, method), quantized_copy(perturbed(base, 0.05), method)


@pytest.mark.parametrize("method", quantizations())
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_batch_rows_keys_and_values_are_a_one_sequence_prefills(kind, method):
    """The ground the moves stand on: what a batch slot holds after its prefill and a ragged pass is, bit for bit,
    what a one-sequence session holds after the same prefill and steps (one token at a time here); and copied into
    a fresh session, the next step's logits are that session's own (torch.equal). (A one-pass prefill longer than
    Gemma 3's window rounds its sliding layers otherwise than that prefill and steps do, in either engine: the
    engines agree on each history, which is what a move carries.)"""
    target, _ = quantized_pair(kind, method)
    tokens = PROMPTS[3] + [5, 6, 7]
    batch = BatchSession(target, 2, 64)
    batch.prefill(0, PROMPTS[1])
    batch.prefill(1, tokens[:5])
    batch.extend([torch.tensor([9]), torch.tensor(tokens[5:])], [1, 2])  # ragged: 1 and 6 tokens
    alone, _ = target.start(tokens)
    alone.prefill(tokens[:5])
    for t in tokens[5:]:
        alone.extend([t], 1)
    for (kb, vb), (ka, va) in zip(batch.read_row(1), alone.kv()):
        assert torch.equal(kb, ka) and torch.equal(vb, va)
    fresh = BatchSession(target, 1, 64)
    fresh.prefill(0, tokens)
    whole, _ = target.start(tokens)
    whole.prefill(tokens)  # one prefill each: the same bits
    assert all(torch.equal(kb, ka) and torch.equal(vb, va) for (kb, vb), (ka, va) in zip(fresh.read_row(0), whole.kv()))
    moved, _ = target.start(tokens)
    moved.adopt(batch.read_row(1), len(tokens))
    step = torch.tensor([11, 12])
    assert torch.equal(moved.extend(step, 2), alone.extend(step, 2))
    back = BatchSession(target, 2, 64)
    back.write_row(1, alone.kv(), alone.length)  # and into a batch slot: its pass gives the session's logits
    back.prefill(0, PROMPTS[0])
    fed = back.extend([torch.tensor([3]), torch.tensor([13])], [1, 1])
    assert torch.equal(fed[1], alone.extend(torch.tensor([13]), 1))


@pytest.mark.parametrize("method", quantizations())
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_row_that_moves_between_batch_and_alone_equals_generate_bit_for_bit(kind, method):
    """Rows join while one runs alone (it goes back), leave until one is left (it goes alone again), greedy and
    sampled, a model draft and plain rows: every row's tokens are specdec.generate's."""
    target, draft = quantized_pair(kind, method)
    configs = [GenerationConfig(max_new_tokens=14 + 4 * (i % 3), gamma=2 + i % 3, temperature=0.0 if i % 2 else 1.0,
                                seed=i) for i in range(5)]
    configs[0] = GenerationConfig(max_new_tokens=80, gamma=3, temperature=1.0, seed=0)  # it outlives the others
    for d in (draft, None):
        engine = BatchEngine(target, d, max_batch=3, speculation="rows")
        rows = [engine.add(PROMPTS[0], configs[0])]
        for _ in range(3):  # alone for three rounds
            engine.step()
        assert rows[0].alone and engine.moves == {"alone": 1, "back": 0}
        rows += [engine.add(p, c) for p, c in zip(PROMPTS[1:5], configs[1:5])]
        engine.step()
        assert not rows[0].alone and engine.moves["back"] == 1 and len(engine.rows) == 3
        engine.run()
        assert engine.moves["alone"] >= 2  # the last row went on alone
        alone = [specdec.generate(target, p, draft=d, config=c) for p, c in zip(PROMPTS, configs)]
        assert [r.output.token_ids for r in rows] == [a.token_ids for a in alone], d
        if d is not None:
            assert sum(r.output.stats.drafted for r in rows) > 0


@pytest.mark.parametrize("method", quantizations())
def test_a_lone_row_drafts_with_the_whole_hierarchy(method, monkeypatch):
    """A hierarchy as the batch's draft: rows of the batch draft with its top model, a lone row with all of it
    (the 0.5B under prompt lookup, as specdec serve's default): the tokens are plain decoding's."""
    target, draft = quantized_pair("llama", method)
    hierarchy = [draft, "prompt-lookup"]
    config = GenerationConfig(max_new_tokens=24, gamma=3)
    outs = specdec.generate_batch(target, PROMPTS[:3], draft=hierarchy, config=config, max_batch=2)
    plain = [specdec.generate(target, p, config=config) for p in PROMPTS[:3]]
    assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
    assert any(o.stats.levels for o in outs)  # a row that finished alone reports its hierarchy's inner level
    assert alone_draft(hierarchy, draft).levels[1].name == "prompt-lookup"
    copying = dataclasses.replace(plan_draft(hierarchy), copy_first=True)  # serve's default: copy+0.5b<-prompt-lookup
    assert alone_draft(copying, draft).copy_first
    for lazy_prompt in (1, 10**6):  # the 0.5B drafting from the first round, or only once copies stop paying
        monkeypatch.setattr(hierarchical, "LAZY_PROMPT", lazy_prompt)
        outs = specdec.generate_batch(target, PROMPTS[:3], draft=copying, config=config, max_batch=2)
        assert [o.token_ids for o in outs] == [p.token_ids for p in plain]
        assert any(o.stats.levels and o.stats.levels[0]["level"].startswith("copy+") for o in outs)


@pytest.mark.parametrize("lazy", [True, False])
def test_a_lone_row_leaves_its_prompt_out_of_the_batch_draft(lazy, monkeypatch):
    """A request alone in the server: its prompt is not fed to the batch's draft as it goes in; its drafter alone feeds
    its own model when it first drafts (copying first on a long prompt: only once copies stop paying, so an edit that
    copies may never pay it); tokens as alone."""
    target, draft = quantized_pair("llama", quantizations()[0])
    monkeypatch.setattr(hierarchical, "LAZY_PROMPT", 1 if lazy else 10**6)
    copying = dataclasses.replace(plan_draft([draft, "prompt-lookup"]), copy_first=True)
    engine = BatchEngine(target, draft, max_batch=2, alone_draft=alone_draft(copying, draft), speculation="rows")
    fed = []
    prefill = engine.draft_session.prefill
    monkeypatch.setattr(engine.draft_session, "prefill", lambda *a, **k: fed.append(a) or prefill(*a, **k))
    config = GenerationConfig(max_new_tokens=20, gamma=3)
    row = engine.add(PROMPTS[0], config)
    engine.run()
    assert fed == [] and engine.moves["alone"] == 1
    assert row.output.token_ids == specdec.generate(target, PROMPTS[0], config=config).token_ids
    level = row.output.stats.levels[0]  # the lone row's hierarchy, copying first (its model fed by itself)
    assert level["level"].startswith("copy+") and (lazy or level["calls"] > 0)


def test_a_float_target_and_a_constrained_row_stay_in_the_batch():
    """Float passes may round differently in a batch than in one-sequence steps: such rows never move (and a row
    under a grammar keeps the batch's rounds)."""
    target = load_tiny(eos=None)
    engine = BatchEngine(target, perturbed(target, 0.05), max_batch=2)
    row = engine.add(PROMPTS[0], GenerationConfig(max_new_tokens=10))
    engine.run()
    assert engine.moves == {"alone": 0, "back": 0} and row.output is not None
    chars = quantized_copy(load_tiny_chars(eos=None, hidden=128), "int8")
    engine = BatchEngine(chars, None, max_batch=2)
    row = engine.add(chars.encode("id:"), GenerationConfig(max_new_tokens=4, regex="[a-d]{2}"))
    engine.run()
    assert engine.moves == {"alone": 0, "back": 0} and len(row.output.text) == 2
    quantized, _ = quantized_pair("llama", "int8")
    engine = BatchEngine(quantized, None, max_batch=2, alone=False)
    engine.add(PROMPTS[0], GenerationConfig(max_new_tokens=10))
    engine.run()
    assert engine.moves == {"alone": 0, "back": 0}


def test_a_lone_row_cancelled_gives_its_sessions_back():
    target, draft = quantized_pair("llama", "int8")
    engine = BatchEngine(target, draft, max_batch=2)
    row = engine.add(PROMPTS[1], GenerationConfig(max_new_tokens=30))
    engine.step()  # its prompt goes in
    engine.step()  # its first round, alone
    drafter = row.drafter
    assert row.alone and drafter.session is not None
    engine.cancel(row, "disconnected")
    assert engine.step() == [row] and row.output is None and str(row.error) == "disconnected"
    assert row.session is None and drafter.session is None and not engine.rows


@pytest.mark.parametrize("feed_seconds", [1.0, 1e-6])
def test_a_lone_rows_model_starts_only_where_its_feed_pays(feed_seconds):
    """The lone row's hierarchy, copying first, starts its model only where the server's measured costs say feeding
    it the prompt pays (specdec.batch.alone.start_pays: a second a fed token never does, a microsecond always); the
    tokens are plain decoding's either way."""
    target, draft = quantized_pair("llama", quantizations()[0])
    copying = dataclasses.replace(plan_draft([draft, "prompt-lookup"]), copy_first=True)
    engine = BatchEngine(target, draft, max_batch=2, alone_draft=alone_draft(copying, draft))
    policy = engine.gamma_policy
    for tokens, seconds in ((1, 0.05), (2, 0.051), (4, 0.053)):  # verification nearly free: drafting saves time
        policy.target_time.observe(tokens, seconds)
    policy.draft_time.observe(1, 0.001)
    policy.observe_feed(10, 10 * feed_seconds)
    assert policy.feed_saving(1) > 0
    config = GenerationConfig(max_new_tokens=20, gamma=3)
    row = engine.add(PROMPTS[0], config)
    engine.run()
    assert engine.moves["alone"] == 1
    assert row.output.token_ids == specdec.generate(target, PROMPTS[0], config=config).token_ids
    level = row.output.stats.levels[0]
    assert level["level"].startswith("copy+") and (level["calls"] == 0) == (feed_seconds == 1.0)


def test_a_lone_rows_model_starts_on_a_window_where_only_that_pays(monkeypatch):
    """Where feeding the lone row's model all it lacks does not pay but feeding it the prompt's last WINDOW tokens
    does, the model starts at once on a window (specdec.models.sessions.window): its session holds what the prefix
    cache gave (the head: here an earlier request's prompt) and then the prompt's end. The tokens stay plain decoding's,
    and what the row leaves to the prefix cache for the draft is only the head it held as the sequence's own."""
    from specdec.models.sessions import window

    started = []

    class Recorded(window.WindowSession):
        def __init__(self, session, skipped):
            super().__init__(session, skipped)
            started.append((self.head, skipped))

    monkeypatch.setattr(hierarchical, "WINDOW", 3)
    monkeypatch.setattr(hierarchical, "WindowSession", Recorded)
    target, draft = quantized_pair("llama", quantizations()[0])
    copying = dataclasses.replace(plan_draft([draft, "prompt-lookup"]), copy_first=True)
    engine = BatchEngine(target, draft, max_batch=2, alone_draft=alone_draft(copying, draft),
                         prefix_cache_bytes=1 << 24)
    policy = engine.gamma_policy
    for tokens, seconds in ((1, 0.05), (2, 0.051), (4, 0.053)):
        policy.target_time.observe(tokens, seconds)
    policy.draft_time.observe(1, 0.001)
    policy.observe_feed(1, 1e-9)  # first request: feeding its whole prompt pays
    first = [1] + list(range(10, 29))  # 20 tokens (a prefix cache keeps 16 or more)
    config = GenerationConfig(max_new_tokens=8, gamma=3)
    engine.add(first, config)
    engine.run()
    assert started == []
    second = first + list(range(30, 45))  # 15 new tokens: the window is 3, charged as ceil(3 / WINDOW_SAVING) = 5
    budget = policy.tokens_left(config.max_new_tokens, 0) * policy.feed_saving(1)
    assert budget > 0
    policy.feed_seconds = budget / 10  # 5 tokens' feed pays, 15 tokens' does not
    row = engine.add(second, config)
    engine.run()
    assert row.stats.cached_tokens == len(first)
    assert started == [(len(first), len(second) - len(first) - 3)]
    assert row.output.token_ids == specdec.generate(target, second, config=config).token_ids
    assert row.output.stats.levels[0]["calls"] > 0  # the model drafted
    hit = engine.prefix_cache.lookup(second + row.output.token_ids + [99])
    assert hit.length >= len(second) and hit.draft_length == len(first)


def test_a_window_session_is_bookkeeping_over_the_head_and_the_tail():
    """The window's positions are the sequence's: feeding its tail gives the logits of a session fed the head and the
    tail one after the other; a rollback inside the tail is bookkeeping, one into the skipped stretch drops the window
    (the head kept, the rest fed again)."""
    from specdec.models.sessions.window import WindowSession, contiguous_length

    target, _ = quantized_pair("llama", quantizations()[0])
    sequence = [1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    head, tail = sequence[:2], sequence[7:]
    inner, _ = target.start(sequence)
    inner.prefill(head)
    windowed = WindowSession(inner, 5)
    assert windowed.length == 7 and contiguous_length(windowed) == 2 and windowed.tokens is None
    logits = windowed.extend(tail, 2)
    assert windowed.length == len(sequence)
    plain, _ = target.start(sequence)
    plain.prefill(head)
    assert torch.equal(logits, plain.extend(tail, 2))
    windowed.rollback(len(sequence) - 2)  # inside the tail: the inner session keeps head + 3 tail tokens
    assert windowed.length == len(sequence) - 2 and inner.length == 2 + 3 and windowed.skipped == 5
    windowed.rollback(5)  # into the skipped stretch: back to the head, no window
    assert windowed.skipped == 0 and windowed.length == 2 == contiguous_length(windowed)
    again = windowed.extend(sequence[2:], 1)
    whole, _ = target.start(sequence)
    assert torch.equal(again, whole.extend(sequence, 1))
    with pytest.raises(ValueError, match="a window skips at least one position, not 0"):
        WindowSession(inner, 0)
