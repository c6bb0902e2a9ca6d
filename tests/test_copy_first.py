"""Copying first (specdec.drafters.copying, a hierarchy's ``copy+``): where the sequence repeats itself, the target
verifies a copy of what followed, not the model's draft; the tokens stay the target's (greedy: plain decoding's; T = 1:
its distribution), the model starts only where copies and prompt lookup stop paying, and the copies' acceptance is
learnt from the copies passed over too."""

import dataclasses

import pytest
import torch

import specdec
from specdec.drafters import DraftContext
from specdec.drafters.copying import best_copy, find_copy
from specdec.drafters.hierarchical import LAZY_MISSES, SpeculativeDrafter
from specdec.drafters.plan import plan_draft
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams, standardize
from stats_util import chi_square_pvalue
from tiny import load_tiny, perturbed

V = 8
# the last three tokens occur at the start: a copy proposes what followed them there (2, 4, 1, 3, 5, ...)
REPEATING = [1, 3, 5, 2, 4, 1, 3, 5]


@pytest.fixture(scope="module")
def target():
    return load_tiny(eos=None)


def copying(draft):
    return dataclasses.replace(plan_draft(draft), copy_first=True)


def test_the_spec_prefix_copies_first_and_needs_a_hierarchy_with_a_model_on_top():
    plan = plan_draft("copy+qwen2.5-coder-0.5b:int4@65536<-prompt-lookup")
    assert plan.copy_first and [lv.name for lv in plan.levels] == ["qwen2.5-coder-0.5b", "prompt-lookup"]
    assert str(plan) == "copy+qwen2.5-coder-0.5b:int4@65536<-prompt-lookup"
    assert not plan_draft("qwen2.5-coder-0.5b<-prompt-lookup").copy_first
    for spec in ("copy+prompt-lookup", "copy+qwen2.5-coder-0.5b", "copy+none"):
        with pytest.raises(SpecDecError, match=r"'copy\+' puts copying from the context in front of a hierarchy"):
            plan_draft(spec)


def test_the_copy_and_its_length():
    assert find_copy([7, 1, 2, 3, 4, 5, 6, 1, 2, 3], 4) == [4, 5, 6, 1]
    assert find_copy([7, 1, 2, 9, 1, 2], 4) == []  # a two-token match is no evidence
    # a pass that costs the same at any width: the whole copy; one that costs a step a token: none
    assert best_copy(0.9, 12, lambda n: 1.0)[0] == 12 and best_copy(0.5, 12, lambda n: float(n))[0] == 0
    # a flat pass up to 8 tokens, then a step per token: the copy fills the flat part (8 = 1 pending + 7 copied)
    assert best_copy(0.95, 30, lambda n: max(1.0, n - 7.0))[0] == 7
    # no pass time known: no copy
    assert best_copy(0.9, 12, lambda n: None)[0] == 0


@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_greedy_tokens_are_plain_decodings_and_the_copies_are_counted(target, gamma):
    m1 = perturbed(target, 0.05)
    plain = specdec.generate(target, REPEATING, max_new_tokens=60)
    out = specdec.generate(target, REPEATING, draft=copying([m1, "prompt-lookup"]), gamma=gamma, max_new_tokens=60)
    assert out.token_ids == plain.token_ids
    level = out.stats.levels[0]
    assert level["level"].startswith("copy+") and level["copy_rounds"] > 0
    assert 0 <= level["copied_accepted"] <= level["copied_tokens"]
    assert out.stats.target_calls < plain.stats.target_calls


def exact_joint(target, prompt, sampling):
    """p(x1, x2 | prompt) under the standardized distribution, [V * V]."""
    with torch.inference_mode():
        p1 = standardize(target.hf_model(input_ids=torch.tensor([prompt])).logits[0, -1], sampling)
        batch = torch.tensor([prompt + [x] for x in range(V)])
        p2 = standardize(target.hf_model(input_ids=batch).logits[:, -1], sampling)  # [V, V]
    return (p1[:, None] * p2).flatten()


def test_sampled_tokens_follow_the_targets_distribution(monkeypatch):
    """T = 1: the first two tokens' joint law over 1,500 seeded runs, the first round a copy (the copies' acceptance
    before any was verified set high, so that it is chosen), against the target's exact joint (chi-square)."""
    from specdec.drafters import copying as copy_rules

    monkeypatch.setattr(copy_rules, "ALPHA0", 0.99)
    monkeypatch.setattr(copy_rules, "COPY_ALPHA0", 0.99)
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    draft = copying([perturbed(target, 0.7, seed=3), "prompt-lookup"])
    counts, copies = torch.zeros(V * V), 0
    for seed in range(1500):
        out = specdec.generate(target, REPEATING, draft=draft, max_new_tokens=2, seed=seed, temperature=1.0, gamma=2)
        x1, x2 = out.token_ids[:2]
        counts[x1 * V + x2] += 1
        copies += out.stats.levels[0]["copy_rounds"]
    assert copies >= 1500  # every run's first round verified a copy
    probs = exact_joint(target, REPEATING, SamplingParams(temperature=1.0))
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def started(target, prompt, model=None):
    drafter = SpeculativeDrafter(model or perturbed(target, 0.05), PromptLookupDrafter(), 3, copy_first=True)
    greedy, generator = SamplingParams(temperature=0.0), torch.Generator().manual_seed(0)
    drafter.start(DraftContext(prompt, greedy, generator, target.vocab_size, max_positions=len(prompt) + 40))
    return drafter


def test_on_a_short_prompt_the_model_starts_at_once(target):
    drafter = started(target, [9, 8, 7, 6, 5])
    assert drafter.session is not None and drafter.session.length == 4  # the prompt but its last token


def test_the_model_starts_only_after_rounds_that_copies_and_lookup_left_to_the_target(target, monkeypatch):
    from specdec.drafters import hierarchical

    monkeypatch.setattr(hierarchical, "LAZY_PROMPT", 5)  # (the prompt counts as long)
    drafter = started(target, [9, 8, 7, 6, 5])
    assert drafter.session is None and drafter.forward_passes == 0  # nothing to copy yet: no prompt prefill either
    sequence = [9, 8, 7, 6, 5]
    for miss in range(LAZY_MISSES):
        k = drafter.reach(sequence, 3)
        draft = drafter.propose(sequence, k)  # the level below (prompt lookup) drafts for the target
        assert drafter.session is None and draft.q is None
        drafter.update(0)
        sequence = sequence + [20 + miss]  # the target's own token, not in the context
    draft = drafter.propose(sequence, drafter.reach(sequence, 3))
    assert drafter.session is not None and len(draft) == 3 and draft.q is None  # greedy: q one-hot, not stored
    assert drafter.session.length == len(sequence) + 2  # it caught up the whole sequence, then drafted


def test_the_model_starts_and_wakes_only_where_its_feed_pays(target):
    """With the costs known (a server's lone row, specdec.batch.alone.start_pays), a prompt of any length whose feed
    does not pay leaves M_1 unstarted, and it wakes after the misses only once the feed pays; the tokens stay plain
    decoding's either way."""
    asked = []
    verdict = {"pays": False}

    def pays(n, generated):
        asked.append((n, generated))
        return verdict["pays"]

    drafter = SpeculativeDrafter(perturbed(target, 0.05), PromptLookupDrafter(), 3, copy_first=True)
    drafter.start_pays = pays
    prompt = [9, 8, 7, 6, 5]  # (short: without start_pays M_1 starts at once, test_on_a_short_prompt_...)
    drafter.start(DraftContext(prompt, SamplingParams(temperature=0.0), torch.Generator().manual_seed(0),
                               target.vocab_size, max_positions=len(prompt) + 40))
    assert drafter.session is None and asked == [(5, 0)]  # the whole prompt to feed, nothing generated yet
    sequence = list(prompt)
    for miss in range(LAZY_MISSES + 3):  # misses past LAZY_MISSES: still the level below, the feed asked each round
        draft = drafter.propose(sequence, drafter.reach(sequence, 3))
        assert drafter.session is None and draft.q is None
        drafter.update(0)
        sequence = sequence + [20 + miss]
    assert asked[-1] == (len(sequence) - 1, len(sequence) - 1 - len(prompt))  # (asked before the last token came)
    verdict["pays"] = True
    draft = drafter.propose(sequence, drafter.reach(sequence, 3))
    assert drafter.session is not None and drafter.session.length == len(sequence) + 2 and len(draft) == 3
    assert asked[-1] == (len(sequence), len(sequence) - len(prompt))
    # paying from the start: M_1 caches the prompt at once, as without start_pays
    drafter.start(DraftContext(prompt, SamplingParams(temperature=0.0), torch.Generator().manual_seed(0),
                               target.vocab_size, max_positions=len(prompt) + 40))
    assert drafter.session is not None and drafter.session.length == 4


def test_a_copy_passed_over_still_teaches_its_acceptance(target):
    drafter = started(target, REPEATING)
    drafter.model_alpha.value = 0.999999  # a model round always wins: the copy is passed over
    drafter.draft_times.observe(3, 1e-9)
    drafter.passes.observe(4, 1.0)
    first, later = drafter.copying.first.value, drafter.copying.later.value
    assert drafter.reach(REPEATING, 3) == 3 and drafter._copy is None
    drafter.reach(REPEATING + [2, 4, 1, 3], 3)  # the round wrote what the copy held: both acceptances up
    assert drafter.copying.first.value > first and drafter.copying.later.value > later
    first, later = drafter.copying.first.value, drafter.copying.later.value
    drafter.reach(REPEATING + [2, 4, 1, 3] + [6, 6], 3)  # what followed [4, 1, 3] was 5, not 6: its first token's down
    assert drafter.copying.first.value < first and drafter.copying.later.value == later


def test_a_lazy_model_wakes_on_a_window_where_only_that_pays(target, monkeypatch):
    """A long prompt starts M_1 lazily; after the misses, where feeding it all it lacks does not pay but the last
    WINDOW tokens do (start_pays for WINDOW / WINDOW_SAVING tokens), it wakes on a window: a fresh session fed only
    the sequence's end, its length in the sequence's positions."""
    from specdec.drafters import hierarchical
    from specdec.models.sessions.window import WindowSession, contiguous_length

    monkeypatch.setattr(hierarchical, "LAZY_PROMPT", 8)
    monkeypatch.setattr(hierarchical, "WINDOW", 3)
    asked = []

    def pays(n, generated):
        asked.append(n)
        return n <= 5  # ceil(3 / WINDOW_SAVING) = 5: the window pays, the whole sequence does not

    drafter = SpeculativeDrafter(perturbed(target, 0.05), PromptLookupDrafter(), 3, copy_first=True)
    drafter.start_pays = pays
    prompt = [9, 8, 7, 6, 5, 4, 3, 2, 9, 8]  # 10 tokens: lazy by length
    drafter.start(DraftContext(prompt, SamplingParams(temperature=0.0), torch.Generator().manual_seed(0),
                               target.vocab_size, max_positions=len(prompt) + 40))
    assert drafter.session is None and asked == []
    sequence = list(prompt)
    for miss in range(LAZY_MISSES):
        drafter.propose(sequence, drafter.reach(sequence, 3))
        assert drafter.session is None
        drafter.update(0)
        sequence = sequence + [20 + miss]
    draft = drafter.propose(sequence, drafter.reach(sequence, 3))
    assert asked == [len(sequence), 5] and len(draft) == 3
    session = drafter.session
    assert isinstance(session, WindowSession) and session.head == 0 and session.skipped == len(sequence) - 3
    assert session.length == len(sequence) + 2 and session.inner.length == 3 + 2 and contiguous_length(session) == 0
