"""Where specdec's CPU kernels do not run (a CPU without AVX2, ARM, a failed build, or ``SPECDEC_KERNELS=off``),
the defaults are what runs without them, said once, and generation stays exact with respect to what runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specdec.models.kernels import build

DEFAULTS = """
import warnings
warnings.simplefilter("always")
from specdec import config
from specdec.models.kernels import extension
print("quantize:", config.default_target_quantize("qwen2.5-coder-1.5b", "cpu"))
print("draft:", config.default_draft("cpu"))
print("isa:", extension.usable_isa())
"""

TINY_INT8 = """
import sys
sys.path.insert(0, "tests")
import specdec
from specdec.models.kernels import int8_matmul
from specdec.models.kernels import extension
from tiny import load_tiny, tiny_model, tiny_tokenizer
target = specdec.load(tiny_model(seed=3, sharp=4.0, eos=None), tokenizer=tiny_tokenizer(), quantize="int8")
draft = specdec.load(tiny_model(seed=4, sharp=4.0, eos=None), tokenizer=tiny_tokenizer(), quantize="int8")
plain = specdec.generate(target, "w1 w2 w3", max_new_tokens=24)
spec = specdec.generate(target, "w1 w2 w3", draft=draft, gamma=4, max_new_tokens=24)
print("kernel:", int8_matmul.chosen(), "extension loaded:", extension._extension is not None)
print("same:", plain.token_ids == spec.token_ids, len(spec.token_ids))
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)


def _lines(out: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


def test_turned_off_the_default_is_the_int8_target_through_fbgemm_with_its_int8_draft():
    import torch

    done = run(DEFAULTS, SPECDEC_KERNELS="off")
    assert done.returncode == 0, done.stderr
    got = _lines(done.stdout)
    if "fbgemm" in torch.backends.quantized.supported_engines:
        assert got["quantize"] == "int8" and got["draft"] == "copy+qwen2.5-coder-0.5b:int8<-prompt-lookup"
    else:  # (ARM builds of torch: the float models)
        assert got["quantize"] == "None" and got["draft"] == "copy+qwen2.5-coder-0.5b<-prompt-lookup"
    assert got["isa"] == "None" and "could not build" not in done.stderr  # off is not a failure: no warning


def test_a_failed_build_warns_once_with_the_fix_and_the_defaults_run_without_the_kernels(tmp_path):
    done = run(DEFAULTS, CXX="/bin/false", **{build.ENV_DIR: str(tmp_path / "kernels")})
    assert done.returncode == 0, done.stderr
    got = _lines(done.stdout)
    from specdec.models.kernels import extension

    if not extension.cpu_supported():
        pytest.skip("this CPU runs no specdec kernel: nothing to fail")
    assert got["quantize"] == "int8" and got["draft"] == "copy+qwen2.5-coder-0.5b:int8<-prompt-lookup"
    assert done.stderr.count("could not build specdec's CPU kernels") == 1  # said once, with the fix
    assert "install a C++ compiler" in done.stderr and "runs without its CPU kernels" in done.stderr


def test_without_the_kernels_an_int8_target_and_draft_give_plain_greedy_s_tokens():
    done = run(TINY_INT8, SPECDEC_KERNELS="off")
    assert done.returncode == 0, done.stderr
    assert "kernel: fbgemm extension loaded: False" in done.stdout
    assert "same: True 24" in done.stdout


def test_where_torch_has_no_fbgemm_the_default_is_the_float_pair(monkeypatch):
    """ARM builds of torch (Graviton, Apple silicon): no specdec kernel, no fbgemm: the float target and draft."""
    from specdec import config
    from specdec.models.kernels import int8_matmul
    from specdec.models.kernels import extension

    monkeypatch.setattr(extension, "usable_isa", lambda: None)
    monkeypatch.setattr(int8_matmul, "has_fbgemm", lambda: False)
    assert config.default_target_quantize("qwen2.5-coder-1.5b", "cpu") is None
    assert config.default_draft("cpu") == "copy+qwen2.5-coder-0.5b<-prompt-lookup"
    monkeypatch.setattr(int8_matmul, "has_fbgemm", lambda: True)
    assert config.default_target_quantize("qwen2.5-coder-1.5b", "cpu") == "int8"
