"""One default everywhere: the Python API's first example (specdec.load of the packaged target, specdec.generate
without draft=) runs what specdec generate and specdec serve run: on CPU the exact quantized target and the default
draft, loaded once; dtype= gives the float model, draft=None plain decoding."""

import pytest

import specdec
from specdec.config import (DEFAULT_GAMMA, DEFAULT_GAMMA_AVX2, DEFAULT_TARGET, GenerationConfig, default_draft,
                            default_target_quantize, preset_draft)

PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def target():
    return specdec.load(DEFAULT_TARGET)


def test_the_packaged_target_loads_as_the_cli_runs_it(target):
    assert target.quantization == default_target_quantize(DEFAULT_TARGET, "cpu") is not None
    assert target.block_invariant and target.preset == DEFAULT_TARGET
    assert target.device.type == "cpu"


def test_generate_without_a_draft_drafts_with_the_default_draft_loaded_once(target):
    out = specdec.generate(target, PROMPT, max_new_tokens=24, seed=0)
    plain = specdec.generate(target, PROMPT, draft=None, max_new_tokens=24, seed=0)
    assert out.token_ids == plain.token_ids and out.stats.exact  # exact: the target's own greedy tokens
    assert out.stats.drafted > 0 and plain.stats.drafted == 0 and plain.stats.draft_calls == 0
    drafts = target.default_draft  # the plan, its models loaded
    assert drafts.levels[0].name.name.startswith("qwen2.5-coder-0.5b") and drafts.copy_first
    assert default_draft("cpu").startswith("copy+") and default_draft("cpu").endswith("<-prompt-lookup")
    assert len(out.stats.levels) == 1  # the hierarchy's inner level (prompt lookup under the 0.5B, copying first)
    assert out.stats.levels[0]["level"].startswith("copy+")
    again = specdec.generate(target, PROMPT, max_new_tokens=8, seed=0)
    assert target.default_draft is drafts and again.token_ids == out.token_ids[:8]  # loaded once, kept
    batch = specdec.generate_batch(target, [PROMPT, "class Stack:"], max_new_tokens=12)
    assert batch[0].token_ids == out.token_ids[:12] and all(o.stats.drafted > 0 for o in batch)


def test_the_default_draft_drafts_the_gamma_of_this_cpu_unless_one_is_given(target, monkeypatch):
    """Where the kernels run their AVX2 code (verifying gamma + 1 tokens is dear there) the default draft's model
    proposes DEFAULT_GAMMA_AVX2 tokens a round, elsewhere DEFAULT_GAMMA; a gamma or a config given keeps its own."""
    from specdec.models.kernels import extension

    def longest_model_proposal(**options):
        rounds = []
        out = specdec.generate(target, PROMPT, max_new_tokens=40, seed=0, on_round=rounds.append, **options)
        return out, max(len(r.drafted) for r in rounds if r.source != "copy")  # (a copy's length is its own)

    plain = specdec.generate(target, PROMPT, draft=None, max_new_tokens=40, seed=0)
    for isa, gamma in (("avx2", DEFAULT_GAMMA_AVX2), ("avx512", DEFAULT_GAMMA), (None, DEFAULT_GAMMA)):
        monkeypatch.setattr(extension, "usable_isa", lambda isa=isa: isa)
        out, longest = longest_model_proposal()
        assert longest == gamma and out.token_ids == plain.token_ids
        assert longest_model_proposal(gamma=3)[1] == 3
        rounds = []
        specdec.generate(target, PROMPT, config=GenerationConfig(seed=0, max_new_tokens=40), on_round=rounds.append)
        assert max(len(r.drafted) for r in rounds if r.source != "copy") == DEFAULT_GAMMA
        assert specdec.generate_batch(target, [PROMPT], max_new_tokens=40)[0].token_ids == plain.token_ids
    assert DEFAULT_GAMMA_AVX2 < DEFAULT_GAMMA


def test_other_models_and_a_beam_search_keep_plain_decoding(target):
    from tiny import load_tiny

    tiny = load_tiny(eos=None)
    assert preset_draft(tiny) is None
    assert specdec.generate(tiny, [1, 10, 11], max_new_tokens=6).stats.draft_calls == 0
    beams = specdec.generate(target, PROMPT, num_beams=2, max_new_tokens=6)
    assert beams.stats.draft_calls == 0


def test_a_dtype_or_another_preset_keeps_the_float_model(monkeypatch):
    """What load() asks of a preset, by its options (the weights are not read: _load_preset is stood in for)."""
    import torch

    import specdec.models as models

    asked = []
    monkeypatch.setattr(models, "_load_preset", lambda preset, dtype, quantize, *rest: asked.append((preset, dtype, quantize)))
    specdec.load(DEFAULT_TARGET, device="cpu")
    specdec.load(DEFAULT_TARGET, dtype="bf16", device="cpu")
    specdec.load(DEFAULT_TARGET, quantize="int8", device="cpu")
    specdec.load("smollm2-135m", device="cpu")
    assert asked == [(DEFAULT_TARGET, torch.float32, default_target_quantize(DEFAULT_TARGET, "cpu")),
                     (DEFAULT_TARGET, torch.bfloat16, None), (DEFAULT_TARGET, torch.float32, "int8"),
                     ("smollm2-135m", torch.bfloat16, None)]
