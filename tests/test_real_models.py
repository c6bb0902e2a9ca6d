"""Greedy exactness on the real packaged models (fp32): speculative == plain == transformers.

These load real GGUF-packaged models (converted once into ~/.cache/specdec, or SPECDEC_CACHE).
"""

import pytest
import torch

import specdec
from tiny import captured

pytestmark = pytest.mark.slow

CODE_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
TEXT_PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"


def hf_greedy(model, prompt_ids, n):
    """transformers' greedy continuation: all n tokens, or fewer ending with an end-of-sequence token."""
    with torch.inference_mode():
        out = model.hf_model.generate(torch.tensor([prompt_ids]), do_sample=False, max_new_tokens=n,
                                      pad_token_id=model.tokenizer.pad_token_id or 0)
    ids = out[0, len(prompt_ids):].tolist()
    assert len(ids) == n or (ids and ids[-1] in model.eos_token_ids), ids
    return ids


def assert_equals_transformers(model, out, n):
    """The whole output, not a prefix of transformers' (a plain output that stopped early would pass
    that): same tokens, the same length, ending with EOS exactly when transformers' does."""
    assert out.token_ids == hf_greedy(model, out.prompt_ids, n)
    assert out.stats.stop_reason == ("max_new_tokens" if len(out.token_ids) == n else "eos")


@pytest.fixture(scope="module")
def smollm():
    return specdec.load("smollm2-135m", dtype="fp32")


@pytest.fixture(scope="module")
def qwen_fp32():
    return specdec.load("qwen2.5-coder-0.5b", dtype="fp32")


@pytest.mark.parametrize("prompt", [CODE_PROMPT, TEXT_PROMPT])
def test_smollm2_speculative_equals_plain_and_transformers(smollm, prompt):
    n = 40
    plain = specdec.generate(smollm, prompt, max_new_tokens=n)
    assert_equals_transformers(smollm, plain, n)
    for draft in (smollm, "prompt-lookup", "random", "bigram"):
        for gamma in (1, 3, 8):
            out = specdec.generate(smollm, prompt, draft=draft, gamma=gamma, max_new_tokens=n)
            assert out.token_ids == plain.token_ids, (getattr(draft, "name", draft), gamma)


@pytest.mark.parametrize("captured_steps", [False, True], ids=["static", "static-captured"])
def test_smollm2_static_engine_equals_transformers(smollm, captured_steps, request):
    """The GPU engine's cache and fixed-width steps on a real model (issue 15): the position-indexed
    static cache, and with ``captured_steps`` its steps run through CapturedStep (graphs emulated on CPU)."""
    if captured_steps:
        request.getfixturevalue("emulated_graphs")
        static = captured(smollm)
    else:
        static = specdec.load(smollm.hf_model, tokenizer=smollm.tokenizer, name="smollm2-static", engine="static")
    n = 40
    for prompt in (CODE_PROMPT,) if captured_steps else (CODE_PROMPT, TEXT_PROMPT):
        plain = specdec.generate(static, prompt, max_new_tokens=n)
        assert_equals_transformers(static, plain, n)
        for draft in (static, "prompt-lookup"):
            for gamma in (1, 5):
                out = specdec.generate(static, prompt, draft=draft, gamma=gamma, max_new_tokens=n)
                assert out.token_ids == plain.token_ids, (getattr(draft, "name", draft), gamma)


def test_smollm2_chat_template(smollm):
    out = specdec.generate(smollm, "What is the capital of France?", chat=True, max_new_tokens=20, draft="prompt-lookup")
    assert out.prompt_ids[:3] != smollm.encode("What is")[:3]  # the template wraps the prompt
    assert "Paris" in out.text


def test_smollm2_bf16_sampling_is_seeded(smollm):
    model = specdec.load("smollm2-135m")  # bf16 default
    assert model.dtype == torch.bfloat16
    a = specdec.generate(model, TEXT_PROMPT, draft="prompt-lookup", temperature=1.0, seed=3, max_new_tokens=20)
    b = specdec.generate(model, TEXT_PROMPT, draft="prompt-lookup", temperature=1.0, seed=3, max_new_tokens=20)
    assert a.token_ids == b.token_ids


def test_gemma3_speculative_equals_plain():
    gemma = specdec.load("gemma3-270m", dtype="fp32")
    plain = specdec.generate(gemma, TEXT_PROMPT, max_new_tokens=24)
    assert_equals_transformers(gemma, plain, 24)
    for gamma in (2, 5):
        for draft in ("prompt-lookup", gemma):
            out = specdec.generate(gemma, TEXT_PROMPT, draft=draft, gamma=gamma, max_new_tokens=24)
            assert out.token_ids == plain.token_ids


def test_a_draft_with_another_real_tokenizer(smollm):
    # Gemma 3 (SentencePiece-style, 262k tokens) drafts text for SmolLM2 (byte-level BPE, 49k tokens).
    gemma = specdec.load("gemma3-270m", dtype="fp32")
    plain = specdec.generate(smollm, TEXT_PROMPT, max_new_tokens=24)
    out = specdec.generate(smollm, TEXT_PROMPT, draft=gemma, gamma=3, max_new_tokens=24)
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted > 0


def test_smollm2_drafts_for_the_qwen_target(smollm, qwen_fp32):
    # Issue 16: SmolLM2-135M (another tokenizer) drafting for a Qwen2.5-Coder target, greedy, fp32: the
    # tokens are plain decoding's, raw text and chat template alike.
    target = qwen_fp32
    n = 32
    for prompt, chat, gammas in ((CODE_PROMPT, False, (2, 4)), (TEXT_PROMPT, False, (4,)),
                                 ("Write a haiku about the sea.", True, (4,))):
        plain = specdec.generate(target, prompt, chat=chat, max_new_tokens=n)
        for gamma in gammas:
            out = specdec.generate(target, prompt, chat=chat, draft=smollm, gamma=gamma, max_new_tokens=n)
            assert out.token_ids == plain.token_ids, (prompt, gamma)
            assert out.stats.accepted > 0 and out.stats.time_convert > 0


def test_qwen_speculative_equals_plain_and_transformers(qwen_fp32):
    """The Qwen2.5-Coder architecture in fp32 (the 0.5B as the target, so that a test process stays under
    8 GB: the 1.5B is the same code at 7 GB, and its exact int8 form is tested below), drafted by a bf16 copy
    of itself (another model: its tokens differ now and then), the int8 copy and prompt lookup."""
    target = qwen_fp32
    draft = specdec.load("qwen2.5-coder-0.5b")  # bf16
    n = 32
    plain = specdec.generate(target, CODE_PROMPT, max_new_tokens=n)
    assert_equals_transformers(target, plain, n)
    for d, gamma in ((draft, 1), (draft, 4), ("prompt-lookup", 4)):
        out = specdec.generate(target, CODE_PROMPT, draft=d, gamma=gamma, max_new_tokens=n)
        assert out.token_ids == plain.token_ids, (getattr(d, "name", d), gamma)
    assert out.stats.target_calls <= n
    # The CLI's default kind of draft (the 0.5B in int8) with its default schedule, and a constant gamma.
    int8 = specdec.load("qwen2.5-coder-0.5b", quantize="int8")
    for gamma, schedule in ((6, "adaptive"), (4, "constant")):
        out = specdec.generate(target, CODE_PROMPT, draft=int8, gamma=gamma, gamma_schedule=schedule, max_new_tokens=n)
        assert out.token_ids == plain.token_ids, (gamma, schedule)
    assert out.stats.accepted > n / 2  # constant gamma 4: the int8 copy drafts most tokens the fp32 target picks
