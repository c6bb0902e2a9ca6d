"""A draft's LM head over the vocabulary's first N ids (``@N`` in a draft spec): the kept logits are the full
head's bit for bit, the rest -inf, and speculative decoding with such a draft stays exact (greedy tokens and the
sampled distribution: q is 0 on the ids left out, and the residual keeps their mass)."""

import pytest
import torch

import specdec
from specdec.drafters.spec import DraftLevel, format_spec, parse_spec
from specdec.errors import SpecDecError
from specdec.models.kernels import extension
from specdec.models.quantized.draft_head import SubsetHead, kept_ids, restricted_draft
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import N_RUNS, PROMPT, V, exact_joint, sampled_joint
from tiny import load_tiny, perturbed


def test_kept_ids_are_the_first_n_and_the_end_of_sequence_ids():
    assert kept_ids(4, 10, {9, 2, 12}).tolist() == [0, 1, 2, 3, 9]


@pytest.mark.parametrize("quantize", [None, "int8", pytest.param("int4", marks=pytest.mark.skipif(
    not extension.cpu_supported(), reason="int4 runs on specdec's int8 kernel: this CPU has neither AVX-512 VNNI nor AVX2"))])
def test_the_kept_logits_are_the_full_heads_bit_for_bit(quantize):
    model = load_tiny(vocab=64, eos=None)
    if quantize:
        model = specdec.load(model.hf_model, tokenizer=model.tokenizer, quantize=quantize)
    restricted = restricted_draft(model, 40)
    assert isinstance(restricted.hf_model.get_output_embeddings(), SubsetHead)
    assert not isinstance(model.hf_model.get_output_embeddings(), SubsetHead)  # the original keeps its head
    assert restricted.vocab_size == model.vocab_size == 64 and restricted.name.endswith("@40")
    ids = torch.tensor([[1, 5, 9, 33, 2, 7]])
    with torch.inference_mode():
        full = model.hf_model(input_ids=ids).logits[0]  # [6, 64]
        cut = restricted.hf_model(input_ids=ids).logits[0]
    assert torch.equal(cut[:, :40], full[:, :40]) and bool(torch.isneginf(cut[:, 40:]).all())


def test_a_head_keeps_the_first_n_and_the_end_of_sequence_ids_apart_from_them():
    head = torch.nn.Linear(16, 64, bias=False)
    subset = SubsetHead(head, kept_ids(40, 64, {50, 62}), 64)
    assert subset.leading == 40 and subset.rest.tolist() == [50, 62]  # one slice copy, then two ids one by one
    hidden = torch.randn(3, 16)
    with torch.no_grad():
        rows, cut = subset.rows(hidden), subset(hidden)  # the kept rows' logits [3, 42], all 64
    kept = torch.tensor([*range(40), 50, 62])
    assert torch.equal(cut[:, kept], rows) and torch.allclose(rows, head(hidden).detach()[:, kept], atol=1e-6)
    others = torch.ones(64, dtype=torch.bool)
    others[kept] = False
    assert bool(torch.isneginf(cut[:, others]).all())
    gap = SubsetHead(head, torch.tensor([0, 1, 3, 7]), 64)  # (no leading run past id 1)
    with torch.no_grad():
        assert gap.leading == 2 and torch.equal(gap(hidden)[:, [0, 1, 3, 7]], gap.rows(hidden))


def test_greedy_speculation_with_a_restricted_draft_equals_plain_greedy():
    target = load_tiny(vocab=64, eos=None)
    plain = specdec.generate(target, [1, 10, 11, 12, 13], max_new_tokens=40, temperature=0)
    assert any(t >= 24 for t in plain.token_ids)  # some tokens the draft below cannot propose
    draft = restricted_draft(perturbed(target, 0.05), 24)
    for gamma in (1, 4):
        out = specdec.generate(target, [1, 10, 11, 12, 13], draft=draft, gamma=gamma, max_new_tokens=40, temperature=0)
        assert out.token_ids == plain.token_ids and out.stats.accepted > 0


@pytest.fixture(scope="module")
def target():
    return load_tiny(vocab=V, eos=None, sharp=2.0)


def test_the_first_two_tokens_follow_the_target_with_a_restricted_draft(target):
    """q is 0 on the 3 ids left out (of 8): their mass must come back through the residual max(0, p - q)."""
    draft = restricted_draft(perturbed(target, 1.0, seed=3), 5)
    probs = exact_joint(target, SamplingParams(temperature=1.0))
    assert probs.view(V, V)[5:].sum() > 0.2  # the left-out ids are likely first tokens: a real test of the residual
    counts = sampled_joint(target, draft, N_RUNS, gamma=2, temperature=1.0)
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_the_spec_names_the_cut():
    assert parse_spec("m:int8@65536<-prompt-lookup") == [DraftLevel("m", "int8", 65536), DraftLevel("prompt-lookup", None)]
    assert format_spec(parse_spec("m@300<-bigram")) == "m@300<-bigram"
    with pytest.raises(SpecDecError, match="prompt-lookup has no LM head of specdec's to cut"):
        parse_spec("m<-prompt-lookup@300")
    with pytest.raises(SpecDecError, match="at least 1 id"):
        restricted_draft(load_tiny(), 0)
