"""The batch engine's sampled paths hold the one-sequence engine's standard: speculative sampling, block verification
and lenience, each checked against its exact law by a chi-square test on seeded rows (1,200 of them, in batches
beside rows of other settings), and a planted bug in each that the same test must catch.

The law: the first two tokens of a tiny model's output (tests/test_distribution.py) for speculative sampling and
block verification; for lenience l < 1, the first token's lenient law min(q, p / l) + (1 - beta) norm(max(0, p -
l q)) (Appendix A.5), which is not p.
"""

from __future__ import annotations

import pytest
import torch

from specdec.batch import engine
from specdec.batch.engine import MODEL, BatchEngine
from specdec.config import GenerationConfig
from specdec.sampling import SamplingParams, standardize
from stats_util import chi_square_pvalue
from test_block_verification import plant_ratio_without_q
from test_distribution import PROMPT, V, exact_joint
from test_lenience import lenient_output_distribution
from tiny import load_tiny, perturbed

N = 1200


@pytest.fixture(scope="module")
def pair():
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    return target, perturbed(target, 1.0, seed=3)


def batched_counts(pair, options: dict, tokens: int = 2) -> torch.Tensor:
    """Counts of the first ``tokens`` tokens (1 or 2) of N seeded rows of PROMPT run through one BatchEngine,
    beside rows of other prompts and settings that join and leave."""
    target, draft = pair
    engine = BatchEngine(target, draft, max_batch=10, speculation="rows")
    rows = []
    for seed in range(N):
        rows.append(engine.add(PROMPT, GenerationConfig(seed=seed, **options), draft=MODEL))
        if seed % 3 == 0:
            engine.add([1, 2 + seed % 5, 4], GenerationConfig(seed=seed, temperature=1.0, max_new_tokens=3 + seed % 4),
                       draft=MODEL if seed % 2 else None)
    engine.run()
    counts = torch.zeros(V ** tokens)
    for row in rows:
        ids = row.output.token_ids
        counts[ids[0] * V + ids[1] if tokens == 2 else ids[0]] += 1
    return counts


SAMPLED = dict(temperature=1.0, gamma=3, max_new_tokens=5)
BLOCK = dict(temperature=1.0, gamma=3, max_new_tokens=5, verification="block")


def joint_pvalue(pair, options) -> float:
    counts = batched_counts(pair, options)
    return chi_square_pvalue(counts.numpy(), exact_joint(pair[0], SamplingParams(temperature=1.0)).numpy())


def q_misaligned(monkeypatch):
    """The planted bug for speculative sampling: the draft's q rows off by one position (row i + 1 used for
    token i). (Dropping q altogether would not do: a one-hot test of whatever was drafted is exact.)"""
    real = engine.verify

    def buggy(logits, tokens, q, *args, **kwargs):
        return real(logits, tokens, None if q is None else torch.roll(q, -1, dims=0), *args, **kwargs)

    monkeypatch.setattr(engine, "verify", buggy)


@pytest.mark.parametrize("options", [SAMPLED, BLOCK], ids=["token", "block"])
def test_batched_rows_follow_the_target_law(pair, options):
    assert joint_pvalue(pair, options) > 1e-3


@pytest.mark.parametrize("options, plant", [(SAMPLED, q_misaligned), (BLOCK, plant_ratio_without_q)], ids=["token", "block"])
def test_a_planted_bug_in_the_batched_path_is_caught(pair, options, plant, monkeypatch):
    plant(monkeypatch)
    assert joint_pvalue(pair, options) < 1e-3


def test_batched_lenience_follows_its_law_and_is_not_the_target(pair):
    target, draft = pair
    l = 0.4
    counts = batched_counts(pair, dict(temperature=1.0, gamma=2, max_new_tokens=3, lenience=l), tokens=1)
    with torch.inference_mode():
        sampling = SamplingParams(temperature=1.0)
        p = standardize(target.hf_model(input_ids=torch.tensor([PROMPT])).logits[0, -1], sampling)
        q = standardize(draft.hf_model(input_ids=torch.tensor([PROMPT])).logits[0, -1], sampling)
    assert chi_square_pvalue(counts.numpy(), lenient_output_distribution(p, q, l).numpy()) > 1e-3
    assert chi_square_pvalue(counts.numpy(), p.numpy()) < 1e-3  # not exact, and the rows say so
