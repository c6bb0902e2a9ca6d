"""The decoding methods a benchmark compares, each behind one call: prompt ids in, tokens and time out.

- ``specdec-plain``: :func:`specdec.generate` without a draft (autoregressive baseline, same loop);
- ``specdec-spec``: :func:`specdec.generate` with the draft (a model or a drafter name), gamma constant;
- ``hf-plain``: ``transformers`` ``model.generate`` (greedy, or plain sampling at temperature > 0);
- ``hf-assisted``: ``transformers`` assisted generation with the same draft model and gamma
  (``num_assistant_tokens=gamma``, schedule ``constant``, confidence threshold off), or its prompt
  lookup when the draft is ``prompt-lookup``; a draft with another tokenizer runs transformers'
  universal assisted generation (``tokenizer=`` and ``assistant_tokenizer=``);
- ``llama-cpp``: llama.cpp (``llama-cpp-python``, the optional extra ``specdec[llama]``) plain decoding of
  the target's own GGUF file (a preset's packaged Q4_K_M file, or a ``.gguf`` target) with the same
  prompt token ids and the same thread count. Its weights are the quantized GGUF ones, so its tokens
  are not expected to equal the float target's; it is a speed peer.
- ``llama-cpp-lookup``: the same, with llama.cpp's own speculative decoding by prompt lookup
  (llama-cpp-python's ``LlamaPromptLookupDecoding``, ``num_pred_tokens`` = ``LLAMA_LOOKUP_TOKENS``, the value
  its documentation gives for CPUs): the fastest thing a llama.cpp user runs without a second model.

Only the generation call is timed (:func:`specdec.bench.timing.timed`, under ``torch.inference_mode``);
tokenization happens once beforehand and every method gets the same prompt token ids.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

import specdec
from specdec.bench.timing import timed
from specdec.models import LanguageModel, llama_cpp
from specdec.stats import GenerationStats

METHODS = ("specdec-plain", "specdec-spec", "hf-plain", "hf-assisted", "llama-cpp", "llama-cpp-lookup")
LLAMA_METHODS = ("llama-cpp", "llama-cpp-lookup")
LLAMA_LOOKUP_TOKENS = 2  # llama-cpp-python: "10 ... generally good for gpu, 2 performs better for cpu-only machines"


def default_methods() -> tuple[str, ...]:
    """Every method, the llama.cpp ones only when llama-cpp-python is installed."""
    return tuple(m for m in METHODS if m not in LLAMA_METHODS or llama_cpp.installed())


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
    verification: str = "token"  # specdec only: token or block (both exact)


Runner = Callable[[Sequence[int]], Trial]


def specdec_runner(target: LanguageModel, draft: Any, s: Settings) -> Runner:
    def run(prompt_ids: Sequence[int]) -> Trial:
        out, seconds, cpu = timed(lambda: specdec.generate(
            target, list(prompt_ids), draft=draft, gamma=s.gamma, temperature=s.temperature,
            max_new_tokens=s.max_new_tokens, seed=s.seed, gamma_schedule=s.gamma_schedule, lenience=s.lenience,
            verification=s.verification,
        ), target.device)
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


def hf_runner(target: LanguageModel, s: Settings, *, assistant: Any = None, prompt_lookup: bool = False,
              assistant_tokenizer: Any = None) -> Runner:
    """transformers' generate: plain, with prompt lookup, or assisted by ``assistant`` (a transformers model);
    ``assistant_tokenizer``: the assistant's tokenizer when it differs from the target's (universal assisted
    generation, which converts the assistant's tokens through text)."""
    kwargs = hf_generate_kwargs(target, s)
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = s.gamma
    if assistant_tokenizer is not None:
        kwargs.update(tokenizer=target.tokenizer, assistant_tokenizer=assistant_tokenizer)
    model = target.hf_model

    def run(prompt_ids: Sequence[int]) -> Trial:
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=target.device)  # [1, P]
        attention_mask = torch.ones_like(input_ids)  # [1, P]
        if s.temperature > 0:
            torch.manual_seed(s.seed)
        extra = {"assistant_model": assistant} if assistant is not None else {}
        with assistant_settings(assistant, s.gamma) if assistant is not None else contextlib.nullcontext():
            out, seconds, cpu = timed(lambda: model.generate(input_ids, attention_mask=attention_mask, **kwargs, **extra),
                                       target.device)
        return Trial(out[0, input_ids.shape[1]:].tolist(), seconds, None, cpu)

    return run


def load_llama_cpp(gguf: Path, n_ctx: int, threads: int, seed: int, extra_buffers: bool | None = None,
                   lookup: bool = False) -> Any:
    """A ``llama_cpp.Llama`` for ``gguf`` (``lookup``: with its prompt-lookup draft), its error naming this method."""
    if not llama_cpp.installed():
        raise specdec.SpecDecError(f"the llama-cpp methods need llama-cpp-python: {llama_cpp.INSTALL}")
    draft = None
    if lookup:
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        draft = LlamaPromptLookupDecoding(num_pred_tokens=LLAMA_LOOKUP_TOKENS)
    return llama_cpp.load_llama_cpp(gguf, n_ctx, threads, seed, extra_buffers, draft_model=draft)


def llama_cpp_runner(llm: Any, eos_token_ids: set[int], s: Settings) -> Runner:
    """Plain decoding with llama.cpp's sampler: greedy at temperature 0, else temperature sampling with
    top-k / top-p / min-p off. Prefix reuse between calls is off (``reset()`` first), so every call pays
    its prompt like the other methods."""
    sample = s.temperature > 0
    options = dict(temp=s.temperature if sample else 0.0, top_k=0 if sample else 1, top_p=1.0, min_p=0.0,
                   typical_p=1.0, repeat_penalty=1.0)

    def decode(prompt_ids: Sequence[int]) -> list[int]:
        llm.reset()
        if sample:
            llm.set_seed(s.seed)
        out: list[int] = []
        for token in llm.generate(list(prompt_ids), reset=True, **options):
            out.append(int(token))
            if token in eos_token_ids or len(out) >= s.max_new_tokens:
                break
        return out

    def run(prompt_ids: Sequence[int]) -> Trial:
        tokens, seconds, cpu = timed(lambda: decode(prompt_ids))
        return Trial(tokens, seconds, None, cpu)

    return run

