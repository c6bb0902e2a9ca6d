"""The decoding methods a benchmark compares, each behind one call: prompt ids in, tokens and time out.

- ``specdec-plain``: :func:`specdec.generate` without a draft (autoregressive baseline, same loop);
- ``specdec-spec``: :func:`specdec.generate` with the draft (a model or a drafter name), gamma constant;
- ``hf-plain``: ``transformers`` ``model.generate`` (greedy, or plain sampling at temperature > 0);
- ``hf-assisted``: ``transformers`` assisted generation with the same draft model and gamma
  (``num_assistant_tokens=gamma``, schedule ``constant``, confidence threshold off), or its prompt
  lookup when the draft is ``prompt-lookup``.

Only the generation call is timed (``time.perf_counter`` around it, under ``torch.inference_mode``);
tokenization happens once beforehand and every method gets the same prompt token ids.
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

import specdec
from specdec.models import LanguageModel
from specdec.stats import GenerationStats

METHODS = ("specdec-plain", "specdec-spec", "hf-plain", "hf-assisted")


@dataclass
class Trial:
    """One timed generation. tokens: the new tokens (EOS included when it ended the generation)."""

    tokens: list[int]
    seconds: float
    stats: GenerationStats | None = None  # specdec methods only
    cpu_seconds: float = 0.0  # CPU time of this process during the call (all threads)


@dataclass(frozen=True)
class Settings:
    gamma: int
    temperature: float
    max_new_tokens: int
    seed: int
    gamma_schedule: str = "constant"  # specdec only (see specdec.schedules)
    lenience: float = 1.0  # specdec only; < 1 is not exact (paper Appendix A.5)


Runner = Callable[[Sequence[int]], Trial]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn's result, its wall seconds and this process's CPU seconds over the call.

    CPU seconds / wall seconds near the torch thread count means the call had the cores to itself;
    much lower means other work shared the CPU and the timing is not to be trusted.
    """
    gc.collect()
    with torch.inference_mode():
        c0 = time.process_time()
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
    return result, seconds, cpu


def specdec_runner(target: LanguageModel, draft: Any, s: Settings) -> Runner:
    def run(prompt_ids: Sequence[int]) -> Trial:
        out, seconds, cpu = _timed(lambda: specdec.generate(
            target, list(prompt_ids), draft=draft, gamma=s.gamma, temperature=s.temperature,
            max_new_tokens=s.max_new_tokens, seed=s.seed, gamma_schedule=s.gamma_schedule, lenience=s.lenience,
        ))
        return Trial(list(out.token_ids), seconds, out.stats, cpu)

    return run


def hf_generate_kwargs(target: LanguageModel, s: Settings) -> dict[str, Any]:
    """Arguments that make transformers' generate decode like specdec: same EOS ids, no penalties or warpers."""
    eos = sorted(target.eos_token_ids)
    pad = getattr(target.tokenizer, "pad_token_id", None)
    kwargs: dict[str, Any] = {
        "max_new_tokens": s.max_new_tokens,
        "eos_token_id": eos if len(eos) != 1 else eos[0],
        "pad_token_id": pad if pad is not None else (eos[0] if eos else 0),
        "repetition_penalty": 1.0,
        "no_repeat_ngram_size": 0,
    }
    if s.temperature > 0:
        kwargs.update(do_sample=True, temperature=s.temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False)
    return kwargs


@contextlib.contextmanager
def assistant_settings(draft_hf: Any, gamma: int) -> Iterator[dict[str, Any]]:
    """Make the assistant draft exactly gamma tokens per step, as specdec does.

    transformers reads these settings from the ASSISTANT's generation_config (its candidate generator
    copies ``assistant_model.generation_config``); arguments given to ``generate`` do not reach them.
    Its defaults are 20 tokens and an adaptive confidence threshold of 0.4 that ends drafts early.
    """
    config = draft_hf.generation_config
    wanted = {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0}
    saved = {k: getattr(config, k, None) for k in wanted}
    for k, v in wanted.items():
        setattr(config, k, v)
    try:
        yield wanted
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def hf_runner(target: LanguageModel, s: Settings, *, assistant: Any = None, prompt_lookup: bool = False) -> Runner:
    kwargs = hf_generate_kwargs(target, s)
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = s.gamma
    model = target.hf_model

    def run(prompt_ids: Sequence[int]) -> Trial:
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)  # [1, P]
        attention_mask = torch.ones_like(input_ids)  # [1, P]
        if s.temperature > 0:
            torch.manual_seed(s.seed)
        extra = {"assistant_model": assistant} if assistant is not None else {}
        with assistant_settings(assistant, s.gamma) if assistant is not None else contextlib.nullcontext():
            out, seconds, cpu = _timed(lambda: model.generate(input_ids, attention_mask=attention_mask, **kwargs, **extra))
        return Trial(out[0, input_ids.shape[1]:].tolist(), seconds, None, cpu)

    return run


def build_runners(methods: Sequence[str], target: LanguageModel, draft: Any, s: Settings) -> tuple[dict[str, Runner], dict[str, str]]:
    """Runners for the methods that apply, and a note for each method skipped (why)."""
    runners: dict[str, Runner] = {}
    skipped: dict[str, str] = {}
    for method in methods:
        if method == "specdec-plain":
            runners[method] = specdec_runner(target, None, s)
        elif method == "specdec-spec":
            runners[method] = specdec_runner(target, draft, s)
        elif method == "hf-plain":
            runners[method] = hf_runner(target, s)
        elif method == "hf-assisted":
            if isinstance(draft, LanguageModel):
                runners[method] = hf_runner(target, s, assistant=draft.hf_model)
            elif draft == "prompt-lookup":
                runners[method] = hf_runner(target, s, prompt_lookup=True)
            else:
                skipped[method] = f"transformers has no assisted generation with the {draft!r} drafter"
        else:
            raise specdec.SpecDecError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    return runners, skipped


def step_costs(target: LanguageModel, draft: LanguageModel | None, prompt_ids: Sequence[int], gamma: int,
               repeats: int = 5) -> dict[str, Any]:
    """Median time of one cached forward pass: target over 1 and gamma + 1 new tokens, draft over 1.

    Each timed call recomputes the last k positions of the same sequence on a warm KV cache, which is
    what a decoding step costs. c_direct = draft(1) / target(1): the paper's cost ratio c.
    """
    seq = list(prompt_ids)

    def median_time(model: LanguageModel, k: int) -> float:
        session, _ = model.start(seq)
        session.forward(seq, 1)  # prefill
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            session.forward(seq, k)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    k = min(gamma + 1, len(seq))
    result: dict[str, Any] = {"target_k1_s": median_time(target, 1), f"target_k{k}_s": median_time(target, k)}
    result["verify_cost_ratio"] = result[f"target_k{k}_s"] / result["target_k1_s"]
    result["verify_tokens"] = k
    if draft is not None:
        result["draft_k1_s"] = median_time(draft, 1)
        result["c_direct"] = result["draft_k1_s"] / result["target_k1_s"]
    return result
