"""specdec: exact speculative decoding for transformer language models.

Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding" (ICML 2023).
Notation as in the paper: p is the target model's distribution, q the draft's (approximation
model's), gamma the number of drafted tokens per target call, alpha the acceptance rate, c the cost
ratio of a draft step to a target step.

    import specdec
    target = specdec.load("qwen2.5-coder-1.5b")
    draft = specdec.load("qwen2.5-coder-0.5b")
    out = specdec.generate(target, "def fib(n):", draft=draft, gamma=4, temperature=0.0,
                           max_new_tokens=64, seed=0)
    print(out.text, out.token_ids, out.stats)
"""

from specdec.acceptance import greedy_verification, residual_distribution, speculative_sampling
from specdec.config import GenerationConfig
from specdec.decoding import GenerationOutput, RoundEvent, generate
from specdec.errors import ModelPackageMissing, SpecDecError
from specdec.models import LanguageModel, load
from specdec.sampling import SamplingParams, standardize
from specdec.stats import GenerationStats

__version__ = "0.1.0"

__all__ = [
    "GenerationConfig", "GenerationOutput", "GenerationStats", "LanguageModel", "ModelPackageMissing",
    "RoundEvent", "SamplingParams", "SpecDecError", "generate", "greedy_verification", "load", "residual_distribution",
    "speculative_sampling", "standardize",
]
