"""specdec: exact speculative decoding for transformer language models.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding" (ICML 2023).
Notation as in the paper: p is the target model's distribution, q the draft's (approximation
model's), gamma the number of drafted tokens per target call, alpha the acceptance rate, c the cost
ratio of a draft step to a target step.

    import specdec
    target = specdec.load("qwen2.5-coder-1.5b")   # on CPU: the exact quantized target (dtype="bf16": the float one)
    out = specdec.generate(target, "def fib(n):", max_new_tokens=64, seed=0)   # its default draft, gamma 4
    print(out.text, out.token_ids, out.stats)
"""

import os as _os
import sys as _sys

# OpenMP worker threads that spin between parallel regions instead of sleeping. A decoding step on a CPU is
# hundreds of small kernels (the int8 target's 8-token verification: 66 against 83 ms on the 1.5B), and
# waking sleeping threads for each costs more than the work; llama.cpp's threads poll the same way. The
# OpenMP runtime reads this once, when torch loads it, so it is set only if torch is not imported yet, and
# never over your own choice: OMP_WAIT_POLICY=PASSIVE for a machine shared with other busy processes
# (docs/omp_threads.md). The spinning is bounded (GOMP_SPINCOUNT, about 0.1-0.5 s): ACTIVE alone spins for
# 30 billion iterations, so after a pass the idle threads kept a core busy while other work ran, llama.cpp's
# threads in the same process (the bench's peer: 2x slower) or the other model's.
if "torch" not in _sys.modules and "OMP_WAIT_POLICY" not in _os.environ:
    _os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    _os.environ.setdefault("GOMP_SPINCOUNT", "10000000")

from specdec.acceptance import greedy_verification, residual_distribution, speculative_sampling  # noqa: E402
from specdec.config import GenerationConfig  # noqa: E402
from specdec.decoding import GenerationOutput, RoundEvent, generate  # noqa: E402
from specdec.batch.engine import BatchEngine, generate_batch  # noqa: E402
from specdec.errors import ModelPackageMissing, SpecDecError  # noqa: E402
from specdec.models import LanguageModel, load  # noqa: E402
from specdec.sampling import SamplingParams, standardize  # noqa: E402
from specdec.stats import GenerationStats  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BatchEngine", "GenerationConfig", "GenerationOutput", "GenerationStats", "LanguageModel", "ModelPackageMissing",
    "RoundEvent", "SamplingParams", "SpecDecError", "generate", "generate_batch", "greedy_verification", "load", "residual_distribution",
    "speculative_sampling", "standardize",
]
