"""Which kernel code ran: a process started under the AVX2 recipe (``ATEN_CPU_CAPABILITY=avx2``) runs specdec's
AVX2 code (its call counter moves), and the records say so (``machine_info``'s ``kernels``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from specdec.models.kernels import extension

RUN = """
import json, sys
sys.path.insert(0, "tests")
import specdec
from specdec.models.kernels import extension
from specdec.sweeps.machine import machine_info
from tiny import tiny_model, tiny_tokenizer
target = specdec.load(tiny_model("qwen2", hidden=128, eos=None), tokenizer=tiny_tokenizer(), quantize="int8")
specdec.generate(target, "w1 w2 w3", draft="prompt-lookup", max_new_tokens=12)
ext = extension.loaded()
print(json.dumps({"calls": ext.avx2_calls(), "kernels": machine_info("int8")["kernels"]}))
"""


def ran(**env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU runs no specdec kernel")
def test_the_avx2_recipe_runs_the_avx2_code_and_the_record_says_so():
    got = ran(ATEN_CPU_CAPABILITY="avx2")
    assert got["calls"] > 0  # the GEMMs and the row attention ran the AVX2 code
    assert got["kernels"]["specdec_kernels"] == "avx2" and got["kernels"]["int8_kernel"] == "specdec"
    assert got["kernels"]["aten_cpu_capability"] == "AVX2" and got["kernels"]["env"]["ATEN_CPU_CAPABILITY"] == "avx2"
    assert not got["kernels"]["amx_tiles"]  # (the AVX2 code never uses them)


@pytest.mark.skipif(extension.kernel_isa() != "avx512", reason="this CPU runs the AVX2 code only")
def test_without_the_recipe_an_avx512_cpu_runs_the_avx512_code():
    got = ran()
    assert got["calls"] == 0 and got["kernels"]["specdec_kernels"] == "avx512"
    assert got["kernels"]["aten_cpu_capability"] == torch.backends.cpu.get_cpu_capability()


@pytest.mark.skipif(not extension.cpu_supported(), reason="this CPU runs no specdec kernel")
def test_the_kernels_share_torchs_openmp_runtime():
    """The extension links libgomp by name (-fopenmp); in the process that name resolves to the runtime torch
    loaded: one OpenMP runtime, one thread pool (two would oversubscribe the cores)."""
    from pathlib import Path

    extension.loaded()
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps (not Linux)")
    runtimes = {line.split()[-1] for line in maps.read_text().splitlines()
                if any(name in line.split()[-1] for name in ("libgomp", "libiomp", "libomp"))}
    assert len(runtimes) == 1, runtimes
