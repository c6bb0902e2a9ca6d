"""Lenience (paper Appendix A.5): l = 1 is the exact algorithm; l < 1 bounds every token by p(x)/l."""

import pytest
import torch

import specdec
from specdec import speculative_sampling
from specdec.acceptance import lenient_greedy_mask
from specdec.analysis import alpha_from_distributions
from stats_util import chi_square_pvalue
from tiny import load_tiny, perturbed

P = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
Q = torch.tensor([0.05, 0.1, 0.25, 0.3, 0.3])
N = 100_000


def lenient_output_distribution(p, q, l):
    """P(x) = min(q, p/l) + (1 - beta) * max(0, p - l q) / (1 - l beta), beta = sum min(q, p/l)."""
    beta = torch.minimum(q, p / l).sum()
    residual = (p - l * q).clamp_min(0)
    return torch.minimum(q, p / l) + (1 - beta) * residual / residual.sum()


def draws(l, n=N, seed=0):
    g = torch.Generator().manual_seed(seed)
    counts, accepted = torch.zeros(5), 0
    p = torch.stack([P, P])
    for _ in range(n):
        x = torch.multinomial(Q, 1, generator=g)
        tokens, k = speculative_sampling(p, Q[None], x, g, lenience=l)
        counts[tokens[0]] += 1
        accepted += k
    return counts, accepted / n


def test_lenience_one_is_the_exact_algorithm():
    g1, g2 = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    p = torch.stack([P, P, P])
    q = torch.stack([Q, Q])
    for _ in range(500):
        x = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(1)).flatten()
        a = speculative_sampling(p, q, x, g1)
        b = speculative_sampling(p, q, x, g2, lenience=1.0)
        assert a[0].tolist() == b[0].tolist() and a[1] == b[1]


def test_generate_with_lenience_one_equals_the_default():
    target = load_tiny(eos=None)
    draft = perturbed(target, 0.5)
    a = specdec.generate(target, [1, 5, 6], draft=draft, temperature=1.0, seed=3, max_new_tokens=30)
    b = specdec.generate(target, [1, 5, 6], draft=draft, temperature=1.0, seed=3, max_new_tokens=30, lenience=1.0)
    assert a.token_ids == b.token_ids and a.stats.exact and b.stats.exact


@pytest.mark.parametrize("l", [0.5, 0.2])
def test_no_token_exceeds_p_over_l_and_the_law_is_as_derived(l):
    counts, acceptance = draws(l)
    freq = counts / counts.sum()
    # 4 standard deviations of a frequency at N = 1e5 is at most 4 * 0.5 / 316 = 0.0063
    assert torch.all(freq <= torch.minimum(P / l, torch.ones(5)) + 0.0063)
    assert counts[4] == 0  # p = 0 stays impossible
    assert chi_square_pvalue(counts.numpy(), lenient_output_distribution(P, Q, l).numpy()) > 1e-3
    # the acceptance rate is the closed form sum_x min(p(x)/l, q(x))
    assert acceptance == pytest.approx(alpha_from_distributions(P, Q, lenience=l).item(), abs=0.006)


def test_lenience_changes_the_distribution():
    counts, _ = draws(0.2, n=20_000)
    assert chi_square_pvalue(counts.numpy(), P.numpy()) < 1e-6  # not p any more: it is flagged "not exact"


def test_greedy_lenience_rule():
    logits = torch.log(torch.tensor([[0.5, 0.32, 0.18], [0.6, 0.1, 0.3]]))
    # p(x) >= l * max(p): with l = 0.45, 0.32 >= 0.225 and 0.3 >= 0.27; with l = 0.6, 0.32 >= 0.3 but 0.3 < 0.36
    assert lenient_greedy_mask(logits, torch.tensor([1, 2]), 0.45).tolist() == [True, True]
    assert lenient_greedy_mask(logits, torch.tensor([1, 2]), 0.6).tolist() == [True, False]
    assert lenient_greedy_mask(logits, torch.tensor([2, 1]), 0.6).tolist() == [False, False]


def test_greedy_lenience_accepts_more_and_is_flagged():
    target = load_tiny(eos=None)
    draft = perturbed(target, 1.0, seed=7)
    exact = specdec.generate(target, [1, 5, 6], draft=draft, gamma=4, max_new_tokens=40)
    lenient = specdec.generate(target, [1, 5, 6], draft=draft, gamma=4, max_new_tokens=40, lenience=0.1)
    assert lenient.stats.acceptance_rate > exact.stats.acceptance_rate
    assert lenient.stats.alpha > exact.stats.alpha
    assert not lenient.stats.exact and "NOT EXACT" in lenient.stats.summary()
    assert lenient.to_dict()["stats"]["exact"] is False


def test_sampling_alpha_statistic_uses_the_lenient_closed_form():
    target = load_tiny(eos=None)
    draft = perturbed(target, 1.0, seed=7)
    exact = specdec.generate(target, [1, 5, 6], draft=draft, gamma=3, temperature=1.0, seed=0, max_new_tokens=60)
    lenient = specdec.generate(target, [1, 5, 6], draft=draft, gamma=3, temperature=1.0, seed=0, max_new_tokens=60,
                               lenience=0.3)
    assert lenient.stats.alpha > exact.stats.alpha


def test_invalid_lenience():
    with pytest.raises(specdec.SpecDecError, match="lenience must be in \\(0, 1\\]"):
        specdec.generate(load_tiny(), [1, 2], lenience=0.0)
