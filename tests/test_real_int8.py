"""The real packaged models in block-invariant int8 (the CPU's exact target): a k-token pass equals k one-token
steps bit for bit, and speculative decoding equals the int8 target's own plain decoding.

A module of its own (not test_real_models.py's): the fp32 models that module keeps are gone before the int8
1.5B loads, so that no test process holds both (issue 42: every test process under 8 GB).
"""

import pytest
import torch

import specdec
from memory_report import give_memory_back
from test_real_models import CODE_PROMPT, TEXT_PROMPT

pytestmark = pytest.mark.slow


def _settled(name: str) -> specdec.LanguageModel:
    """The preset in int8, its weights packed, and the load's transient copies handed back to the system
    before the next model loads (the two loads' peaks then do not add up)."""
    from specdec.models.quantized.quantize import wait_packed

    model = specdec.load(name, quantize="int8")
    wait_packed(model.hf_model)
    give_memory_back()
    return model


@pytest.fixture(scope="module")
def target():
    return _settled("qwen2.5-coder-1.5b")


@pytest.fixture(scope="module")
def draft(target):  # after the target: the larger load's transient copies on a process holding nothing else
    return _settled("qwen2.5-coder-0.5b")


def test_int8_targets_block_equals_one_token_steps_bit_for_bit(draft):
    """The real 0.5B in block-invariant int8: a k-token pass gives the logits of k one-token steps exactly
    (k = 2..9, three prefix lengths, after a rolled-back detour)."""
    from test_quantize import steps_and_block

    model = draft
    seq = model.encode(CODE_PROMPT + TEXT_PROMPT + CODE_PROMPT)
    assert len(seq) >= 40
    for prefix in (5, 17, 30):
        for k in range(2, 10):
            steps, block = steps_and_block(model, seq, prefix, k)
            assert torch.equal(steps, block), (prefix, k, (steps - block).abs().max().item())


@pytest.mark.parametrize("prompt", [CODE_PROMPT, TEXT_PROMPT])
def test_int8_target_speculative_equals_its_plain_decoding(prompt, target, draft):
    """The int8 1.5B target with the int8 0.5B draft (adaptive and constant gamma), prompt lookup and a
    hierarchy: token for token its own plain decoding, labelled exact."""
    assert target.block_invariant
    n = 40
    plain = specdec.generate(target, prompt, draft=None, max_new_tokens=n)
    for d, gamma, schedule in ((draft, 6, "adaptive"), (draft, 4, "constant"), ("prompt-lookup", 4, "constant"),
                               ([draft, "prompt-lookup"], 6, "constant")):
        out = specdec.generate(target, prompt, draft=d, gamma=gamma, gamma_schedule=schedule, max_new_tokens=n)
        assert out.token_ids == plain.token_ids, (getattr(d, "name", d), gamma, schedule)
        assert out.stats.exact
    assert out.stats.accepted > 0
