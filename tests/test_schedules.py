"""Gamma schedules (issue: adaptive drafting): the rules, and exactness of every schedule."""

import pytest

import specdec
from specdec.analysis import optimal_gamma
from specdec.schedules import AdaptiveSchedule, HeuristicSchedule, StepFeedback, make_schedule
from stats_util import chi_square_pvalue
from test_distribution import V, exact_joint, sampled_joint
from specdec.sampling import SamplingParams
from tiny import load_tiny, perturbed

SCHEDULES = ["constant", "heuristic", "adaptive", "confidence"]
PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]


def test_heuristic_rule():
    s = HeuristicSchedule(gamma=4, max_gamma=7)
    trace = []
    for drafted, accepted in [(4, 4), (6, 6), (7, 7), (7, 3), (6, 0), (5, 0), (4, 0), (3, 0), (2, 0), (1, 0), (1, 1)]:
        s.update(StepFeedback(drafted, accepted, [], 0.0, 0.0))
        trace.append(s.next_gamma())
    assert trace == [6, 7, 7, 6, 5, 4, 3, 2, 1, 1, 3]


def test_adaptive_follows_theorem_8():
    s = AdaptiveSchedule(gamma=4, max_gamma=16, decay=0.0)  # decay 0: the last step only
    s.update(StepFeedback(4, 4, [0.9] * 4, time_draft=0.4, time_target=1.0))  # c = 0.1 per token
    assert s.alpha == pytest.approx(0.9) and s.c == pytest.approx(0.1)
    assert s.next_gamma() == optimal_gamma(0.9, 0.1, 16)
    s.update(StepFeedback(4, 0, [0.2], time_draft=0.4, time_target=1.0))
    assert s.next_gamma() == optimal_gamma(0.2, 0.1, 16) == 1


def test_adaptive_estimates_alpha_with_an_exponential_average():
    s = AdaptiveSchedule(gamma=3, max_gamma=10, decay=0.5, alpha0=0.8)
    s.update(StepFeedback(2, 1, [1.0, 0.0], time_draft=0.2, time_target=1.0))
    assert s.alpha == pytest.approx((0.5 * 0.8 + 0.5) * 0.5)


def test_confidence_drafts_less_when_the_draft_is_unsure():
    target = load_tiny(eos=None)
    draft = perturbed(target, 0.3)
    loose = specdec.generate(target, PROMPT, draft=draft, gamma=4, gamma_schedule="confidence", confidence=0.01,
                             max_new_tokens=30)
    strict = specdec.generate(target, PROMPT, draft=draft, gamma=4, gamma_schedule="confidence", confidence=0.9,
                              max_new_tokens=30)
    assert strict.stats.drafted < loose.stats.drafted
    assert strict.token_ids == loose.token_ids


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("gamma", [1, 3])
def test_every_schedule_keeps_greedy_exact(schedule, gamma):
    target = load_tiny(eos=None)
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    for draft in (perturbed(target, 0.05), perturbed(target, 1.0, seed=7), "bigram"):
        out = specdec.generate(target, PROMPT, draft=draft, gamma=gamma, gamma_schedule=schedule, max_gamma=8,
                               max_new_tokens=40)
        assert out.token_ids == plain.token_ids, (schedule, gamma, getattr(draft, "name", draft))


def test_heuristic_grows_gamma_with_a_perfect_draft():
    target = load_tiny(eos=None)
    out = specdec.generate(target, PROMPT, draft=target, gamma=1, gamma_schedule="heuristic", max_gamma=9,
                           max_new_tokens=40)
    assert len(out.stats.drafted_per_position) == 9  # it reached max_gamma


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_keeps_the_distribution(schedule):
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    draft = perturbed(target, 1.0, seed=3)
    probs = exact_joint(target, SamplingParams(temperature=1.0))
    counts = sampled_joint(target, draft, 2000, gamma=2, gamma_schedule=schedule, max_gamma=4, confidence=0.3,
                           temperature=1.0)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_invalid_schedule_options():
    target = load_tiny()
    with pytest.raises(specdec.SpecDecError, match="gamma_schedule must be one of constant, heuristic, adaptive, confidence"):
        specdec.generate(target, PROMPT, draft="bigram", gamma_schedule="fast")
    with pytest.raises(specdec.SpecDecError, match="max_gamma must be an integer >= gamma"):
        specdec.generate(target, PROMPT, draft="bigram", gamma=6, max_gamma=3)
    with pytest.raises(specdec.SpecDecError, match="confidence must be in \\(0, 1\\)"):
        specdec.generate(target, PROMPT, draft="bigram", confidence=1.5)
    assert make_schedule("constant", 5, 12).next_gamma() == 5
