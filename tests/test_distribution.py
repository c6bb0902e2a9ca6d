"""End to end: speculative sampling on a tiny random model generates the target's distribution.

The exact joint distribution of the first two generated tokens is computed from the target
(8 tokens -> 64 outcomes); seeded runs of specdec.generate are compared to it with a chi-square
goodness-of-fit test at significance 1e-3 (seeded, so deterministic).
"""


import pytest
import torch

import specdec
from specdec.sampling import SamplingParams, standardize
from stats_util import chi_square_pvalue
from tiny import load_tiny, perturbed

PROMPT = [1, 3, 5, 2]
N_RUNS = 2000
N_RUNS_SEVERAL = 1500  # 5 tokens per run (and the static engine attends over its whole buffer): dearer runs
V = 8


@pytest.fixture(scope="module")
def target():
    return load_tiny(vocab=V, eos=None, sharp=2.0)


def exact_joint(target, sampling):
    """p(x1, x2 | prompt) under the standardized distribution, as a [V * V] vector."""
    with torch.inference_mode():
        logits1 = target.hf_model(input_ids=torch.tensor([PROMPT])).logits[0, -1]
        p1 = standardize(logits1, sampling)
        batch = torch.tensor([PROMPT + [x] for x in range(V)])
        p2 = standardize(target.hf_model(input_ids=batch).logits[:, -1], sampling)  # [V, V]
    return (p1[:, None] * p2).flatten()


def sampled_joint(target, draft, n_runs, max_new_tokens=2, **options):
    counts = torch.zeros(V * V)
    for seed in range(n_runs):
        out = specdec.generate(target, PROMPT, draft=draft, max_new_tokens=max_new_tokens, seed=seed, **options)
        x1, x2 = out.token_ids[:2]
        counts[x1 * V + x2] += 1
    return counts


@pytest.mark.parametrize(
    "draft_kind, options",
    [
        ("model", dict(gamma=2, temperature=1.0)),
        ("model", dict(gamma=1, temperature=0.7, top_k=5, top_p=0.9)),
        ("prompt-lookup", dict(gamma=2, temperature=1.0)),
        ("suffix", dict(gamma=3, temperature=1.0)),
        ("none", dict(temperature=1.0)),
    ],
)
def test_first_two_tokens_follow_the_target(target, draft_kind, options):
    draft = {"model": perturbed(target, 1.0, seed=3), "prompt-lookup": "prompt-lookup", "suffix": "suffix",
             "none": None}[draft_kind]
    sampling = SamplingParams(temperature=options["temperature"], top_k=options.get("top_k"), top_p=options.get("top_p", 1.0))
    probs = exact_joint(target, sampling)
    counts = sampled_joint(target, draft, N_RUNS, **options)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_the_draft_is_actually_different(target):
    # Guard for the test above: the draft must disagree with the target enough for speculative
    # sampling to reject and resample often; otherwise the test would not exercise the residual.
    draft = perturbed(target, 1.0, seed=3)
    out = specdec.generate(target, PROMPT, draft=draft, gamma=2, max_new_tokens=200, temperature=1.0, seed=0)
    assert out.stats.alpha < 0.9
    assert out.stats.acceptance_rate < 0.9


@pytest.mark.parametrize("engine", ["dynamic", "static"])
def test_first_two_tokens_follow_the_target_when_every_round_drafts_several_tokens(target, engine):
    # max_new_tokens=2 clamps every draft to 1 token (the budget keeps room for the target's token),
    # which would hide a q row misaligned at draft position >= 2. With gamma 3 and 5 new tokens, every
    # round that decides the first two tokens drafts 3 (k = min(gamma, 5 - generated - 1) >= 3).
    model = specdec.load(target.hf_model, tokenizer=target.tokenizer, engine=engine)
    draft = specdec.load(perturbed(target, 1.0, seed=3).hf_model, tokenizer=target.tokenizer, engine=engine)
    sampling = SamplingParams(temperature=1.0)
    probs = exact_joint(target, sampling)
    counts = sampled_joint(model, draft, N_RUNS_SEVERAL, max_new_tokens=5, gamma=3, temperature=1.0)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3
    out = specdec.generate(model, PROMPT, draft=draft, gamma=3, max_new_tokens=5, temperature=1.0, seed=0)
    assert out.stats.drafted_per_position[2] >= 1  # the first round drafted 3 tokens
