"""Hierarchical speculative decoding: exact with two and three draft levels."""

import pytest
import torch

import specdec
from specdec.drafters import SpeculativeDrafter, make_drafter
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import PROMPT as DIST_PROMPT, V, exact_joint, sampled_joint
from tiny import load_tiny, perturbed

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]


@pytest.fixture(scope="module")
def target():
    return load_tiny(eos=None)


def hierarchies(target):
    m1 = perturbed(target, 0.05)
    m2 = perturbed(target, 0.3, seed=2)
    return {
        "model<-prompt-lookup": [m1, "prompt-lookup"],
        "model<-bigram": [m1, "bigram"],
        "model<-model<-prompt-lookup": [m1, m2, "prompt-lookup"],
        "model<-model": [m1, m2],
    }


@pytest.mark.parametrize("gamma", [1, 2, 4])
def test_greedy_equality(target, gamma):
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    for name, draft in hierarchies(target).items():
        out = specdec.generate(target, PROMPT, draft=draft, gamma=gamma, max_new_tokens=40)
        assert out.token_ids == plain.token_ids, (name, gamma)
        assert len(out.stats.levels) == len(draft) - 1  # one entry per model level that drafts with speculation


def test_level_statistics(target):
    m1, m2 = perturbed(target, 0.05), perturbed(target, 0.3, seed=2)
    out = specdec.generate(target, PROMPT, draft=[m1, m2, "prompt-lookup"], gamma=3, max_new_tokens=30)
    levels = out.stats.levels
    assert [lvl["level"].count("<-") for lvl in levels] == [2, 1]  # m1<-(m2<-lookup), then m2<-lookup
    top = levels[0]
    assert top["calls"] > 0 and top["new_tokens"] >= out.stats.drafted
    assert 0.0 <= top["alpha"] <= 1.0
    assert "level" in out.stats.summary()


@pytest.mark.parametrize("levels", [2, 3])
def test_distribution(levels):
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    m1 = perturbed(target, 0.7, seed=3)
    m2 = perturbed(target, 1.5, seed=4)
    draft = [m1, "prompt-lookup"] if levels == 2 else [m1, m2, "bigram"]
    probs = exact_joint(target, SamplingParams(temperature=1.0))
    counts = sampled_joint(target, draft, 1200, gamma=2, temperature=1.0)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_middle_level_output_follows_the_middle_model():
    # The tokens a level proposes are exact samples of that level's model: the first proposed token's
    # distribution is the middle model's own, whatever its inner draft.
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    m1 = perturbed(target, 0.7, seed=3)
    q1 = exact_joint(m1, SamplingParams(temperature=1.0)).reshape(V, V).sum(1)  # m1's first-token marginal
    drafter = make_drafter([m1, "bigram"], target, inner_gamma=3)
    counts = torch.zeros(V)
    from specdec.drafters import DraftContext

    for seed in range(1500):
        drafter.start(DraftContext(DIST_PROMPT, SamplingParams(temperature=1.0), torch.Generator().manual_seed(seed), V))
        draft = drafter.propose(DIST_PROMPT, 3)
        counts[draft.tokens[0]] += 1
        torch.testing.assert_close(draft.q.sum(-1), torch.ones(len(draft)))
    assert chi_square_pvalue(counts.numpy(), q1.numpy()) > 1e-3


def test_parameter_free_drafter_cannot_be_a_middle_level(target):
    with pytest.raises(specdec.SpecDecError, match="every level but the last must be a model"):
        specdec.generate(target, PROMPT, draft=["prompt-lookup", target])
    with pytest.raises(specdec.SpecDecError, match="draft=\\[\\] is empty"):
        specdec.generate(target, PROMPT, draft=[])
    assert isinstance(make_drafter([target, "bigram"], target), SpeculativeDrafter)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_lower_levels_forget_what_the_target_rejected(target, temperature):
    # m2 is m1 itself: with correct caches M_1 accepts every token m2 proposes (p == q at that level),
    # while the target rejects some of M_1's proposals. A level below that kept the rejected tokens
    # in its cache would propose from a wrong context, and M_1 would reject some of its tokens.
    m1 = perturbed(target, 0.3)
    m2 = perturbed(target, 0.3)  # the same seed: the same weights as m1
    out = specdec.generate(target, PROMPT, draft=[m1, m2], gamma=4, max_new_tokens=40,
                           temperature=temperature, seed=0)
    assert out.stats.accepted < out.stats.drafted  # the target did reject some tokens
    level = out.stats.levels[0]
    assert level["drafted"] > 0 and level["accepted"] == level["drafted"]


def test_every_level_runs_the_generations_own_round(target, monkeypatch):
    """One round function (specdec.rounds.speculative_round) for the target and for each level below it."""
    import specdec.decoding
    import specdec.rounds

    calls = []
    original = specdec.rounds.speculative_round

    def counted(session, drafter, *args, **kwargs):
        calls.append(getattr(drafter, "name", None))
        return original(session, drafter, *args, **kwargs)

    monkeypatch.setattr(specdec.rounds, "speculative_round", counted)
    monkeypatch.setattr(specdec.decoding, "speculative_round", counted)
    m1, m2 = perturbed(target, 0.05), perturbed(target, 0.3, seed=2)
    out = specdec.generate(target, PROMPT, draft=[m1, m2, "prompt-lookup"], gamma=3, max_new_tokens=30)
    top, middle = out.stats.levels
    assert calls.count(f"{m1.name}<-{m2.name}<-prompt-lookup") == out.stats.target_calls
    assert calls.count(f"{m2.name}<-prompt-lookup") == top["calls"] and calls.count("prompt-lookup") == middle["calls"]
    assert len(calls) == out.stats.target_calls + top["calls"] + middle["calls"]
