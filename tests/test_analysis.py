"""The closed forms pinned to the paper: Table 1, Corollary 9, Lemma 3, Appendix A.5."""

import math

import pytest
import torch

from specdec.analysis import (
    alpha_from_distributions, expected_tokens, lk_divergence, logit_distance, min_improvement, operations_factor,
    optimal_gamma, oracle_expected_tokens, speculation_pays, walltime_improvement,
)

# Paper Table 1 (c = c_hat = 0): alpha, gamma, operations, speed (two decimals in the paper).
TABLE_1 = [
    (0.6, 2, 1.53, 1.96),
    (0.7, 3, 1.58, 2.53),
    (0.8, 2, 1.23, 2.44),
    (0.8, 5, 1.63, 3.69),
    (0.9, 2, 1.11, 2.71),
    (0.9, 10, 1.60, 6.86),
]


@pytest.mark.parametrize("alpha, gamma, operations, speed", TABLE_1)
def test_table_1(alpha, gamma, operations, speed):
    assert round(walltime_improvement(alpha, gamma, 0.0), 2) == speed
    assert round(operations_factor(alpha, gamma, 0.0), 2) == operations


def test_equation_1_edges():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(1 - 1e-12, 3) == pytest.approx(4.0)
    assert expected_tokens(0.8, 5) == pytest.approx((1 - 0.8**6) / 0.2)


def test_theorem_8_with_cost():
    # (1 - 0.8^6) / (0.2 * (5 * 0.1 + 1))
    assert walltime_improvement(0.8, 5, 0.1) == pytest.approx((1 - 0.8**6) / (0.2 * 1.5))
    assert walltime_improvement(1.0, 4, 0.25) == pytest.approx(5 / 2)


@pytest.mark.parametrize("alpha, c", [(0.5, 0.1), (0.8, 0.4), (0.9, 0.05), (0.3, 0.29)])
def test_corollary_9(alpha, c):
    assert min_improvement(alpha, c) == pytest.approx(walltime_improvement(alpha, 1, c))
    best = walltime_improvement(alpha, optimal_gamma(alpha, c), c)
    assert best >= min_improvement(alpha, c) > 1.0  # alpha > c: an improvement exists


def test_no_improvement_when_alpha_below_c():
    assert min_improvement(0.2, 0.5) < 1.0
    assert all(walltime_improvement(0.2, g, 0.5) < 1.0 for g in range(1, 20))


def test_optimal_gamma_maximises_theorem_8():
    for alpha in (0.5, 0.7, 0.8, 0.9, 0.95):
        for c in (0.0, 0.05, 0.2, 0.4):
            g = optimal_gamma(alpha, c, max_gamma=40)
            values = [walltime_improvement(alpha, k, c) for k in range(1, 41)]
            assert walltime_improvement(alpha, g, c) == pytest.approx(max(values))
    assert optimal_gamma(0.8, 0.0, max_gamma=12) == 12  # free drafts: draft as far as allowed
    assert optimal_gamma(0.8, 0.4) < optimal_gamma(0.8, 0.05)  # costlier drafts: shorter drafts
    assert optimal_gamma(0.9, 0.05) > optimal_gamma(0.6, 0.05)  # better drafts: longer drafts


def test_oracle_bound():
    assert oracle_expected_tokens(0.8) == pytest.approx(5.0)
    assert oracle_expected_tokens(1.0) == math.inf
    assert expected_tokens(0.8, 50) == pytest.approx(oracle_expected_tokens(0.8), rel=1e-4)


def test_alpha_and_divergence_lemma_3():
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [1.0, 0.0, 0.0, 0.0]])
    q = torch.tensor([[0.5, 0.25, 0.15, 0.1], [0.0, 0.0, 0.5, 0.5]])
    beta = alpha_from_distributions(p, q)
    torch.testing.assert_close(beta, torch.tensor([0.9, 0.0]))
    torch.testing.assert_close(lk_divergence(p, q), 1 - beta)  # Lemma 3; disjoint supports give 1


def test_logit_distance_kl_beta_and_agreement():
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(3, 5, 7, generator=g)  # [batch, positions, V]
    lq = lp + 0.5 * torch.randn(3, 5, 9, generator=g)[..., :7]
    lq_padded = torch.cat([lq, torch.full((3, 5, 2), -1e4)], -1)  # a padded vocabulary's extra rows, cut
    d = logit_distance(lp.double(), lq_padded)
    expected_kl = torch.nn.functional.kl_div(lq.log_softmax(-1), lp.log_softmax(-1), log_target=True,
                                             reduction="none").sum(-1)
    torch.testing.assert_close(d.kl, expected_kl)
    torch.testing.assert_close(d.beta, alpha_from_distributions(lp.softmax(-1), lq.softmax(-1)))
    assert d.agree.tolist() == (lp.argmax(-1) == lq.argmax(-1)).tolist()
    assert 0 < int(d.agree.sum()) < 15  # the noise moves some argmaxes, not all
    same = logit_distance(lp, lp + 3.0)  # a shift of the logits is the same distribution
    torch.testing.assert_close(same.kl, torch.zeros(3, 5), atol=1e-6, rtol=0)
    torch.testing.assert_close(same.beta, torch.ones(3, 5))
    assert bool(same.agree.all())
    with pytest.raises(ValueError, match="same positions"):
        logit_distance(lp, lq[:, :4])


def test_lenience_alpha_appendix_a5():
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.5, 0.25, 0.15, 0.1])
    for l in (1.0, 0.5, 0.3, 0.1):
        a = alpha_from_distributions(p, q, lenience=l)
        assert a.item() == pytest.approx((torch.minimum(p, l * q).sum() / l).item())
    assert alpha_from_distributions(p, q, lenience=0.1).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="lenience must be in"):
        alpha_from_distributions(p, q, lenience=0.0)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="alpha must be in"):
        expected_tokens(1.5, 2)
    with pytest.raises(ValueError, match="gamma must be a non-negative integer"):
        expected_tokens(0.5, -1)
    with pytest.raises(ValueError, match="c must be >= 0"):
        walltime_improvement(0.5, 2, -0.1)


def test_verification_cost_adds_to_c():
    """A pass over gamma + 1 tokens costing 1 + s gamma steps: Theorem 8's denominator is 1 + gamma (c + s)."""
    assert walltime_improvement(0.8, 5, 0.1, s=0.2) == pytest.approx((1 - 0.8**6) / (0.2 * (1 + 5 * 0.3)))
    assert walltime_improvement(0.8, 5, 0.1, s=0.0) == walltime_improvement(0.8, 5, 0.1)
    for alpha, c, s in ((0.9, 0.2, 0.02), (0.9, 0.2, 0.3), (0.6, 0.1, 0.4)):
        assert optimal_gamma(alpha, c, 20, s=s) == optimal_gamma(alpha, c + s, 20)
    with pytest.raises(ValueError, match="s must be >= 0"):
        walltime_improvement(0.8, 2, 0.1, s=-0.1)


def test_speculation_pays_exactly_when_some_gamma_wins():
    for alpha in (0.0, 0.3, 0.5, 0.7, 0.9, 0.99):
        for c in (0.0, 0.1, 0.2, 0.5):
            for s in (0.0, 0.05, 0.3, 0.8):
                wins = max(walltime_improvement(alpha, g, c, s) for g in range(1, 60)) > 1.0 + 1e-12
                assert speculation_pays(alpha, c, s) == wins, (alpha, c, s)
    assert min_improvement(0.9, 0.1, 0.3) == pytest.approx(1.9 / 1.4)


def test_a_fixed_cost_per_round_favours_longer_drafts():
    """f target steps per round whatever gamma (a model draft's catch-up pass): Theorem 8's denominator gains f,
    the best gamma grows, and speculation can pay only from some gamma on (gamma = 1 no longer decides)."""
    assert walltime_improvement(0.9, 4, 0.1, s=0.05, f=0.5) == pytest.approx(expected_tokens(0.9, 4) / (4 * 0.15 + 1.5))
    assert optimal_gamma(0.944, 0.37, 8, s=0.09, f=0.37) > optimal_gamma(0.944, 0.37, 8, s=0.09)
    alpha, c, s, f = 0.9, 0.2, 0.1, 0.8
    assert walltime_improvement(alpha, 1, c, s, f) < 1.0 < walltime_improvement(alpha, 6, c, s, f)
    assert speculation_pays(alpha, c, s, f, max_gamma=8) and not speculation_pays(alpha, c, s, f, max_gamma=1)
    for alpha in (0.3, 0.7, 0.95):
        for f in (0.0, 0.4, 1.5):
            wins = max(walltime_improvement(alpha, g, 0.2, 0.1, f) for g in range(1, 17)) > 1.0
            assert speculation_pays(alpha, 0.2, 0.1, f, max_gamma=16) == wins, (alpha, f)
    with pytest.raises(ValueError, match="f must be >= 0"):
        walltime_improvement(0.8, 2, 0.1, f=-0.1)
