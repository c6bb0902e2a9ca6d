"""llama.cpp drafts (``:llama-cpp``, the optional extra specdec[llama]): a preset's GGUF in llama-cpp-python
behind the session interface. Without llama-cpp-python the error says how to install it; with it (the real
0.5B GGUF), rollback is exact bookkeeping and the int8 target's output is its own plain decoding."""

import pytest
import torch

import specdec
from specdec.models import llama_cpp

CODE_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
needs_llama = pytest.mark.skipif(not llama_cpp.installed(), reason="llama-cpp-python is not installed "
                                 "(pip install 'specdec[llama]')")


def test_without_llama_cpp_python_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(llama_cpp, "installed", lambda: False)
    with pytest.raises(specdec.SpecDecError, match=r"quantize='llama-cpp' runs the model's GGUF with llama.cpp, "
                       r"which needs llama-cpp-python: pip install 'specdec\[llama\]'"):
        specdec.load("qwen2.5-coder-0.5b", quantize="llama-cpp")
    from specdec.drafters import plan_draft

    with pytest.raises(specdec.SpecDecError, match="needs llama-cpp-python"):
        plan_draft("qwen2.5-coder-0.5b:llama-cpp<-prompt-lookup").check()
    plan_draft("qwen2.5-coder-0.5b:int8<-prompt-lookup").check()  # everything else works without it


def test_a_llama_cpp_model_is_refused_as_the_target(capsys):
    from specdec.decoding import check_target
    from specdec.models.llama_cpp import LlamaCppModel

    loaded = LlamaCppModel.__new__(LlamaCppModel)  # a llama.cpp model as its type declares it (no GGUF read)
    loaded.name = "qwen2.5-coder-0.5b+llama-cpp"
    with pytest.raises(specdec.SpecDecError, match="runs in llama.cpp, which specdec uses for drafts only"):
        check_target(loaded)
    from specdec.cli import main

    assert main(["generate", "x", "--quantize", "llama-cpp", "--max-new-tokens", "1"]) == 2
    assert "specdec: error: --quantize llama-cpp: llama.cpp runs drafts only" in capsys.readouterr().err


def test_only_gguf_sources_run_in_llama_cpp(tmp_path, monkeypatch):
    monkeypatch.setattr(llama_cpp, "installed", lambda: True)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(specdec.SpecDecError, match="quantize='llama-cpp' runs a GGUF file: give a preset name"):
        specdec.load(str(tmp_path), quantize="llama-cpp")


@pytest.fixture(scope="module")
def llama_draft():
    return specdec.load("qwen2.5-coder-0.5b", quantize="llama-cpp")


@needs_llama
@pytest.mark.slow
def test_llama_cpp_session_rolls_back_by_bookkeeping(llama_draft):
    ids = llama_draft.encode(CODE_PROMPT)
    session, _ = llama_draft.start(ids)
    session.prefill(ids[:-4])
    first = session.extend(ids[-4:-1], 1)  # [1, V]
    assert first.shape == (1, llama_draft.vocab_size) and session.length == len(ids) - 1
    session.extend([7, 8], 1)  # a detour, forgotten below
    session.rollback(len(ids) - 4)
    assert session.length == len(ids) - 4
    assert torch.equal(session.extend(ids[-4:-1], 1), first)  # the same pass after rollback: the same logits
    rows = session.extend([ids[-1], 11, 12], 3)  # several logits in one pass (a verifying hierarchy level)
    session.rollback(len(ids) - 1)
    step = session.extend([ids[-1]], 1)
    assert rows.shape == (3, llama_draft.vocab_size)
    assert torch.allclose(rows[0], step[0], atol=0.05)  # llama.cpp's batched kernels: close, not identical
    assert int(rows[0].argmax()) == int(step[0].argmax())


@needs_llama
@pytest.mark.slow
def test_int8_target_with_a_llama_cpp_draft_equals_its_plain_decoding(llama_draft):
    target = specdec.load("qwen2.5-coder-1.5b", quantize="int8")
    n = 40
    plain = specdec.generate(target, CODE_PROMPT, draft=None, max_new_tokens=n)
    for draft, gamma, schedule in ((llama_draft, 6, "adaptive"), (llama_draft, 3, "constant"),
                                   ([llama_draft, "prompt-lookup"], 4, "constant"),
                                   ("qwen2.5-coder-0.5b:llama-cpp", 4, "constant")):
        out = specdec.generate(target, CODE_PROMPT, draft=draft, gamma=gamma, gamma_schedule=schedule, max_new_tokens=n)
        assert out.token_ids == plain.token_ids, (gamma, schedule)
        assert out.stats.exact and out.stats.drafted > 0
        # a constant gamma keeps drafting, and the 0.5B is accepted most of the time; the adaptive schedule picks
        # plain steps from measured times where drafting looks dear (one CI run: 15 plain steps, 19 of 40 accepted)
        assert schedule == "adaptive" or out.stats.accepted > n / 2, (gamma, schedule, out.stats.accepted)


@needs_llama
@pytest.mark.slow
def test_the_bench_runs_llama_cpps_own_prompt_lookup_speculation():
    """The bench's ``llama-cpp-lookup`` peer: llama.cpp with llama-cpp-python's LlamaPromptLookupDecoding draft."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from specdec.bench.methods import LLAMA_LOOKUP_TOKENS, Settings, llama_cpp_runner, load_llama_cpp
    from specdec.models.llama_cpp import target_gguf

    target = specdec.load("qwen2.5-coder-0.5b")
    ids = target.encode(CODE_PROMPT * 2)
    settings = Settings(4, 0.0, 24, 0, "constant", 1.0, "token")
    llms = [load_llama_cpp(target_gguf("qwen2.5-coder-0.5b"), 512, 2, 0, lookup=lookup) for lookup in (False, True)]
    assert llms[0].draft_model is None
    assert isinstance(llms[1].draft_model, LlamaPromptLookupDecoding)
    assert llms[1].draft_model.num_pred_tokens == LLAMA_LOOKUP_TOKENS
    plain, lookup = (llama_cpp_runner(llm, target.eos_token_ids, settings)(ids).tokens for llm in llms)
    assert len(lookup) == 24 and all(0 <= t < target.vocab_size for t in lookup)
    assert lookup[0] == plain[0]  # the first token comes from the prompt's pass in both


def test_llama_cpp_extra_buffers_are_on_unless_its_amx_kernel_would_run_or_the_user_says():
    """llama.cpp's extra weight buffer types: off where the CPU has AMX and the build holds ggml's AMX kernel (it
    crashed there), on elsewhere (its fastest configuration on the AVX-512 EPYC, and on the AMX Xeon with a build
    without AMX); SPECDEC_LLAMA_EXTRA_BUFFERS decides when set."""
    avx512, amx = {"avx512f", "avx512_vnni"}, {"avx512f", "avx512_vnni", "amx_tile"}
    assert llama_cpp.extra_buffers_default(avx512, None) and llama_cpp.extra_buffers_default(avx512, "")
    assert llama_cpp.extra_buffers_default(avx512, None, amx_in_build=True)
    assert not llama_cpp.extra_buffers_default(amx, None) and not llama_cpp.extra_buffers_default(amx, None, True)
    assert llama_cpp.extra_buffers_default(amx, None, amx_in_build=False)
    assert llama_cpp.extra_buffers_default(amx, "1") and not llama_cpp.extra_buffers_default(avx512, "0")
    assert not llama_cpp.extra_buffers_default(amx, "0", amx_in_build=False)
    with pytest.raises(specdec.SpecDecError, match="SPECDEC_LLAMA_EXTRA_BUFFERS must be 0 or 1, not 'yes'"):
        llama_cpp.extra_buffers_default(avx512, "yes")


@needs_llama
def test_build_has_amx_reads_llama_cpps_system_info(monkeypatch):
    """A build with ggml's AMX kernel says ``AMX_INT8 = 1`` in its system info (pip's build on an AMX CPU); the build
    without it (compiled with -mno-amx-*) does not list it."""
    import llama_cpp as llama_cpp_python

    with_amx = b"CPU : AVX512 = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 | "
    monkeypatch.setattr(llama_cpp_python, "llama_print_system_info", lambda: with_amx)
    assert llama_cpp.build_has_amx()
    monkeypatch.setattr(llama_cpp_python, "llama_print_system_info", lambda: with_amx.replace(b"AMX_INT8 = 1 | ", b""))
    assert not llama_cpp.build_has_amx()


@needs_llama
def test_the_configuration_a_bench_reports_is_the_one_the_loader_uses(monkeypatch):
    import llama_cpp as llama_cpp_python

    monkeypatch.setattr(llama_cpp_python, "llama_print_system_info", lambda: b"CPU : AVX512 = 1 | REPACK = 1 | ")
    monkeypatch.setenv("SPECDEC_LLAMA_EXTRA_BUFFERS", "0")
    assert llama_cpp.configuration() == {"llama_cpp_python": llama_cpp_python.__version__, "amx_in_build": False,
                                         "extra_buffer_types": False}
    monkeypatch.delenv("SPECDEC_LLAMA_EXTRA_BUFFERS")
    assert llama_cpp.configuration()["extra_buffer_types"]  # no AMX kernel in the build: on, on any CPU
    assert llama_cpp.configuration(extra_buffers=False)["extra_buffer_types"] is False
