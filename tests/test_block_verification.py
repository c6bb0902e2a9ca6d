"""Block verification (Sun et al., ICLR 2025; ``verification="block"``): exact, never fewer accepted tokens
in expectation than token verification, the same as token verification for one-hot drafts and greedy.

The end-to-end test is the held-out style of test_distribution.py: the exact joint law of the first two
tokens of a tiny model, against seeded generations whose every round drafts three tokens (chi-square at
1e-3). A planted bug (the draft's probabilities taken as 1 in the running ratio, a bug vLLM's users hit)
must fail it.
"""

import pytest
import torch

import specdec
from specdec import acceptance
from specdec.acceptance import block_acceptance, speculative_sampling
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import N_RUNS_SEVERAL, PROMPT, V, exact_joint, sampled_joint
from tiny import load_tiny, perturbed


@pytest.fixture(scope="module")
def pair():
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    return target, perturbed(target, 1.0, seed=3)


def block_law_pvalue(pair):
    target, draft = pair
    probs = exact_joint(target, SamplingParams(temperature=1.0))
    counts = sampled_joint(target, draft, N_RUNS_SEVERAL, max_new_tokens=5, gamma=3, temperature=1.0,
                           verification="block")
    return chi_square_pvalue(counts.numpy(), probs.numpy())


def test_block_verification_keeps_the_targets_distribution(pair):
    assert block_law_pvalue(pair) > 1e-3


def plant_ratio_without_q(monkeypatch):
    """The planted bug: the draft probabilities taken as 1 inside the running ratio (p_i = min(1, p_{i-1} p(x_i)))."""
    real = acceptance.block_acceptance

    def buggy(p, q, draft_tokens, eta):
        rows = torch.arange(draft_tokens.shape[0])
        q_bug = q.clone()
        q_bug[rows, draft_tokens] = 1.0
        return real(p, q_bug, draft_tokens, eta)

    monkeypatch.setattr(acceptance, "block_acceptance", buggy)


def test_a_planted_bug_fails_the_distribution_test(pair, monkeypatch):
    plant_ratio_without_q(monkeypatch)
    assert block_law_pvalue(pair) < 1e-3


def _draw(p, q, generator):
    """A draft of len(q) tokens sampled from q's rows (rows independent of the prefix)."""
    return torch.stack([torch.multinomial(row, 1, generator=generator)[0] for row in q])


def test_block_accepts_at_least_as_many_tokens_as_token_verification():
    """Over drafts sampled from q and uniform draws, block verification's mean accepted length is at least
    token verification's (the paper's Theorem 2), and larger for these rows; the same drafts for both."""
    g = torch.Generator().manual_seed(0)
    gamma, vocab, trials = 4, 6, 20000
    p = torch.softmax(torch.randn(gamma + 1, vocab, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(gamma, vocab, generator=g) * 2, -1)
    token_n, block_n = [], []
    for _ in range(trials):
        x = _draw(p, q, g)
        _, n = speculative_sampling(p, q, x, g)
        tau, _ = block_acceptance(p, q, x, torch.rand(gamma, generator=g))
        token_n.append(n)
        block_n.append(int(tau))
    token_mean, block_mean = sum(token_n) / trials, sum(block_n) / trials
    assert block_mean > token_mean + 0.02, (block_mean, token_mean)  # standard errors ~0.007 each


def test_block_acceptance_for_one_token_is_token_acceptance():
    """gamma = 1: h_1 = min(1, p(x)/q(x)), the token rule."""
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6]])
    q = torch.tensor([[0.25, 0.5, 0.25]])
    x = torch.tensor([1])
    assert int(block_acceptance(p, q, x, torch.tensor([0.59]))[0]) == 1  # 0.59 <= 0.3 / 0.5
    assert int(block_acceptance(p, q, x, torch.tensor([0.61]))[0]) == 0


def test_one_hot_drafts_and_greedy_are_token_verification(pair):
    target, draft = pair
    for options in (dict(draft="prompt-lookup", temperature=1.0), dict(draft=draft, temperature=0.0)):
        for seed in range(5):
            token = specdec.generate(target, PROMPT * 3, gamma=3, max_new_tokens=20, seed=seed, **options)
            block = specdec.generate(target, PROMPT * 3, gamma=3, max_new_tokens=20, seed=seed,
                                     verification="block", **options)
            assert block.token_ids == token.token_ids and block.stats.accepted == token.stats.accepted


def test_block_verification_options_are_checked():
    with pytest.raises(specdec.SpecDecError, match="verification must be one of token, block, got 'blocks'"):
        specdec.GenerationConfig(verification="blocks")
    with pytest.raises(specdec.SpecDecError, match="lenience < 1 is a token-by-token rule"):
        specdec.GenerationConfig(verification="block", lenience=0.5)
    with pytest.raises(specdec.SpecDecError, match="does not support verification='block'"):
        specdec.GenerationConfig(verification="block", num_beams=2)
