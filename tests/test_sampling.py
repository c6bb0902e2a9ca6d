import pytest
import torch

from specdec import SamplingParams, SpecDecError, standardize


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 3.0, 2.9], [5.0, -1.0, 0.0]])
    probs = standardize(logits, SamplingParams(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]


def test_temperature_scales_logits():
    logits = torch.tensor([0.0, 1.0, 2.0])
    torch.testing.assert_close(standardize(logits, SamplingParams(temperature=2.0)), torch.softmax(logits / 2, -1))
    torch.testing.assert_close(standardize(logits, SamplingParams(temperature=1.0)), torch.softmax(logits, -1))


def test_top_k_keeps_k_tokens_and_renormalises():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    probs = standardize(logits, SamplingParams(temperature=1.0, top_k=2))
    torch.testing.assert_close(probs, torch.tensor([0.0, 4 / 7, 0.0, 3 / 7]))


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.4, [0.0, 1.0, 0.0, 0.0]),  # 0.4 alone reaches 0.4
        (0.5, [0.0, 4 / 7, 0.0, 3 / 7]),  # 0.4 < 0.5: add 0.3
        (0.75, [0.0, 4 / 9, 2 / 9, 3 / 9]),  # 0.7 < 0.75: add 0.2
        (1.0, [0.1, 0.4, 0.2, 0.3]),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    logits = torch.log(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    probs = standardize(logits, SamplingParams(temperature=1.0, top_p=top_p))
    torch.testing.assert_close(probs, torch.tensor(expected))


def test_rows_are_independent():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.7, 0.1, 0.1, 0.1]]))
    probs = standardize(logits, SamplingParams(temperature=1.0, top_p=0.5))
    torch.testing.assert_close(probs, torch.tensor([[0.0, 4 / 7, 0.0, 3 / 7], [1.0, 0.0, 0.0, 0.0]]))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.5}, "temperature must be >= 0"),
        ({"temperature": float("nan")}, "temperature must be a finite number >= 0"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0"),
        ({"top_k": 0}, "top_k must be an integer >= 1"),
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\]"),
        ({"top_p": 1.5}, "top_p must be in \\(0, 1\\]"),
    ],
)
def test_invalid_settings(kwargs, message):
    with pytest.raises(SpecDecError, match=message):
        SamplingParams(**kwargs)


def test_sample_follows_the_distribution_and_never_draws_zero_probability_tokens():
    from specdec.sampling import sample
    from stats_util import chi_square_pvalue

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.2, 0.25, 0.05, 0.0],  # zeros at both ends and inside
                          [0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.9]])
    generator = torch.Generator().manual_seed(0)
    n = 20000
    draws = sample(probs.expand(n, -1, -1), generator)  # [n, 2]
    assert draws.shape == (n, 2)
    for row in range(2):
        counts = torch.bincount(draws[:, row], minlength=7)
        assert counts[probs[row] == 0].sum() == 0
        assert chi_square_pvalue(counts.numpy(), probs[row].numpy()) > 1e-3
    # Unnormalized rows are scaled, and a real vocabulary's width works: mass on 3 of 151,936 ids.
    wide = torch.zeros(151936)
    wide[[7, 70000, 151935]] = torch.tensor([2.0, 1.0, 1.0])
    counts = torch.bincount(torch.stack([sample(wide, generator) for _ in range(4000)]), minlength=151936)
    assert set(counts.nonzero().flatten().tolist()) == {7, 70000, 151935}
    assert chi_square_pvalue(counts[[7, 70000, 151935]].numpy(), [0.5, 0.25, 0.25]) > 1e-3
