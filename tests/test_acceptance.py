"""speculative_sampling as a pure function: hand-made cases, the seeds' worked examples, and the
output distribution over 100,000 seeded draws."""

import pytest
import torch

from specdec import greedy_verification, residual_distribution, speculative_sampling
from specdec.acceptance import acceptance_probability
from stats_util import chi_square_pvalue, total_variation

# Significance level for the goodness-of-fit tests. The draws are seeded, so each test is
# deterministic; 1e-3 means a correct sampler would fail one such seed in a thousand, while the
# sensitivity test below shows that a wrong sampler gives p-values of 0 at this sample size.
ALPHA_LEVEL = 1e-3
N_DRAWS = 100_000


def test_worked_example_003_residual():
    # Seed 003: p = [0.4, 0.3, 0.2, 0.1] (target), q = [0.5, 0.25, 0.15, 0.1] (draft), draft token "is" (0).
    p = torch.tensor([0.4, 0.3, 0.2, 0.1])
    q = torch.tensor([0.5, 0.25, 0.15, 0.1])
    residual = residual_distribution(p, q, torch.tensor(0))
    torch.testing.assert_close(residual, torch.tensor([0.0, 0.5, 0.5, 0.0]))
    # Rejection probability of "is": 1 - 0.4 / 0.5 = 0.2, and beta = sum min(p, q) = 0.9.
    assert acceptance_probability(p[None], q[None]).item() == pytest.approx(0.9)


def test_worked_example_004_swapped_letters():
    # Seed 004 calls the draft p and the target q. In specdec's notation: target p = [0.6, 0.3, 0.1],
    # draft q = [0.4, 0.5, 0.1]; token B (1) is accepted with probability min(1, 0.3 / 0.5) = 0.6,
    # and on rejection the residual is [1, 0, 0].
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.4, 0.5, 0.1])
    torch.testing.assert_close(residual_distribution(p, q, torch.tensor(1)), torch.tensor([1.0, 0.0, 0.0]))
    accepted = 0
    g = torch.Generator().manual_seed(0)
    for _ in range(20_000):
        tokens, n = speculative_sampling(torch.stack([p, p]), q[None], torch.tensor([1]), g)
        accepted += n
        if n == 0:
            assert tokens.tolist() == [0]  # the residual puts all its mass on A
    assert accepted / 20_000 == pytest.approx(0.6, abs=0.015)  # 4.4 standard deviations


def test_all_accepted_appends_bonus_from_last_row():
    # q <= p on every drafted token: always accepted; the bonus comes from p's last row (one-hot here).
    p = torch.tensor([[0.1, 0.9, 0.0], [0.0, 0.2, 0.8], [0.0, 0.0, 1.0]])
    q = torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    for seed in range(20):
        tokens, n = speculative_sampling(p, q, torch.tensor([1, 2]), torch.Generator().manual_seed(seed))
        assert (tokens.tolist(), n) == ([1, 2, 2], 2)


def test_token_with_zero_target_probability_is_always_rejected():
    p = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for seed in range(50):
        tokens, n = speculative_sampling(p, q, torch.tensor([0]), torch.Generator().manual_seed(seed))
        assert n == 0 and tokens.tolist()[0] in (1, 2)


def test_one_hot_draft_residual_excludes_the_rejected_token():
    p = torch.tensor([[0.5, 0.25, 0.25], [1.0, 0.0, 0.0]])
    for seed in range(50):
        tokens, n = speculative_sampling(p, None, torch.tensor([0]), torch.Generator().manual_seed(seed))
        assert n == 1 or tokens.tolist()[0] in (1, 2)


def test_residual_without_mass_falls_back_to_p_and_never_nan():
    p = torch.tensor([0.25, 0.25, 0.5])
    residual = residual_distribution(p, p.clone(), torch.tensor(2))
    assert torch.isfinite(residual).all()
    torch.testing.assert_close(residual, p)
    # p - q negative everywhere up to rounding noise: still finite.
    q = p + 1e-12
    assert torch.isfinite(residual_distribution(p, q / q.sum(), torch.tensor(0))).all()


def test_empty_draft_samples_from_p():
    p = torch.tensor([[0.0, 1.0, 0.0]])
    tokens, n = speculative_sampling(p, None, torch.empty(0, dtype=torch.long), torch.Generator().manual_seed(0))
    assert (tokens.tolist(), n) == ([1], 0)


def test_shape_errors():
    with pytest.raises(ValueError, match="gamma \\+ 1"):
        speculative_sampling(torch.ones(2, 3) / 3, None, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="q must have"):
        speculative_sampling(torch.ones(3, 3) / 3, torch.ones(1, 3) / 3, torch.tensor([0, 1]))


@pytest.mark.parametrize(
    "tokens_target, draft, expected, n",
    [
        ([5, 6, 7], [5, 6], [5, 6, 7], 2),  # all accepted + bonus
        ([5, 6, 7], [5, 9], [5, 6], 1),  # mismatch at position 2: target's own token
        ([5, 6, 7], [4, 6], [5], 0),  # mismatch at once
        ([3], [], [3], 0),  # no draft
    ],
)
def test_greedy_verification(tokens_target, draft, expected, n):
    out, got_n = greedy_verification(torch.tensor(tokens_target), torch.tensor(draft, dtype=torch.long))
    assert out.tolist() == expected and got_n == n


def first_token_counts(p, q, draft_sampler, n_draws, seed=0):
    """Histogram of the first output token of speculative_sampling over seeded draws."""
    g = torch.Generator().manual_seed(seed)
    V = p.shape[-1]
    counts = torch.zeros(V)
    for _ in range(n_draws):
        draft = draft_sampler(g)
        tokens, _ = speculative_sampling(p, q, draft, g)
        counts[tokens[0]] += 1
    return counts


CASES = {
    # name: (p rows [gamma + 1, V], q rows [gamma, V])
    "worked-example": ([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4]], [[0.5, 0.25, 0.15, 0.1]]),
    # q puts mass where p has none (token 3) and p puts mass where q has none (token 0).
    "disjoint-supports": ([[0.5, 0.3, 0.2, 0.0, 0.0], [0.2] * 5], [[0.0, 0.1, 0.3, 0.4, 0.2]]),
    # gamma = 3 with different rows: the first output token still follows p_1.
    "gamma-3": (
        [[0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.9, 0.05, 0.05], [0.2, 0.2, 0.6]],
        [[0.5, 0.2, 0.3], [0.1, 0.1, 0.8], [0.3, 0.4, 0.3]],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_first_token_follows_p(case):
    p_rows, q_rows = CASES[case]
    p, q = torch.tensor(p_rows), torch.tensor(q_rows)

    def draft_sampler(g):  # x_i ~ q_i, as the draft would (p rows do not depend on the draft here)
        return torch.multinomial(q, 1, generator=g).flatten()

    counts = first_token_counts(p, q, draft_sampler, N_DRAWS)
    assert chi_square_pvalue(counts, p[0]) > ALPHA_LEVEL
    assert total_variation(counts, p[0]) < 0.01  # expected TV at 1e5 draws is ~0.002


def test_second_token_follows_p2_given_first_accepted():
    # With rows that do not depend on the prefix, output token 2 (when emitted in the same step, i.e.
    # token 1 was the accepted draft x_1) must follow p_2 conditioned on that event.
    p = torch.tensor([[0.3, 0.7], [0.8, 0.2], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.5], [0.4, 0.6]])
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(2)
    for _ in range(N_DRAWS):
        draft = torch.multinomial(q, 1, generator=g).flatten()
        tokens, n = speculative_sampling(p, q, draft, g)
        if n >= 1:
            counts[tokens[1]] += 1
    assert chi_square_pvalue(counts, p[1]) > ALPHA_LEVEL


def test_one_hot_draft_first_token_follows_p():
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.25] * 4])
    counts = first_token_counts(p, None, lambda g: torch.tensor([3]), N_DRAWS)
    assert chi_square_pvalue(counts, p[0]) > ALPHA_LEVEL


def test_the_check_detects_a_wrong_sampler(monkeypatch):
    # Sensitivity: specdec's own speculative_sampling with its residual step replaced by resampling
    # from p (a classic mistake) must fail the same statistic decisively. This keeps the thresholds
    # above honest: they can tell a wrong sampler from a right one at this sample size.
    import specdec.acceptance

    p = torch.tensor(CASES["worked-example"][0])
    q = torch.tensor(CASES["worked-example"][1])

    def draft_sampler(g):
        return torch.multinomial(q, 1, generator=g).flatten()

    monkeypatch.setattr(specdec.acceptance, "residual_distribution", lambda p, q, rejected, lenience=1.0: p)
    wrong = first_token_counts(p, q, draft_sampler, 20_000)
    # min(p, q) + (1 - beta) p = [0.44, 0.28, 0.17, 0.11] instead of p[0] = [0.4, 0.3, 0.2, 0.1]
    assert chi_square_pvalue(wrong, p[0]) < 1e-6
    assert total_variation(wrong, torch.tensor([0.44, 0.28, 0.17, 0.11])) < 0.01
    monkeypatch.undo()
    right = first_token_counts(p, q, draft_sampler, 20_000)  # same draws, the real residual
    assert chi_square_pvalue(right, p[0]) > ALPHA_LEVEL
