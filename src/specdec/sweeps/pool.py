"""The drafts of ``specdec bench`` and ``specdec alpha``, written in the one draft syntax
(:mod:`specdec.drafters.spec`: ``qwen2.5-coder-0.5b:int8<-prompt-lookup``), and the models they load.

Unigram and bigram drafts are fitted once on a corpus when one is given (a fixed model, as in the paper's
Table 3), else on the prompt and the generated text.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.devices import resolve_device
from specdec.drafters import DraftContext, DrafterBase, NGramDrafter, plan_draft
from specdec.drafters.plan import DRAFTER_NAMES, is_model_spec
from specdec.errors import SpecDecError
from specdec.models import LanguageModel

__all__ = ["CorpusNGramDrafter", "ModelPool", "build_draft", "check_models", "corpus_ids", "is_model_spec", "needs_corpus",
           "spec_models"]


class CorpusNGramDrafter(NGramDrafter):
    """An n-gram draft fitted once on a fixed corpus: ``start`` does not refit (no cost per generation)."""

    def __init__(self, order: int, corpus_ids: Sequence[int]):
        super().__init__(order, corpus_ids)

    def start(self, context: DraftContext) -> None:
        DrafterBase.start(self, context)
        self._last_len = len(context.prompt_ids)


class ModelPool:
    """Loads each model once. ``models`` pre-seeds it (name or ``name:quant`` -> loaded model)."""

    def __init__(self, dtype: Any = None, models: dict[str, LanguageModel] | None = None, device: Any = None,
                 random_weights: bool = False, compile: bool = False):
        self.dtype = dtype
        self.device = device
        self.random_weights = random_weights
        self.compile = compile
        self.models: dict[str, LanguageModel] = dict(models or {})
        self.llama_cpp: Any = None  # the llama.cpp peer (a llama_cpp.Llama), loaded when a bench asks for it
        self.llama_cpp_lookup: Any = None  # the same with its prompt-lookup draft (llama-cpp-lookup)

    def get(self, name: str, quantize: str | None = None) -> LanguageModel:
        import specdec

        key = f"{name}:{quantize}" if quantize else name
        if key not in self.models:
            if name in DRAFTER_NAMES:
                raise SpecDecError(f"{name!r} is a drafter, not a model")
            if self.random_weights:
                from specdec.models import parse_dtype
                from specdec.models.random_weights import random_model

                if quantize:
                    raise SpecDecError("--random-weights models are not quantized; drop :int8 from the draft")
                model = random_model(name, parse_dtype(self.dtype), resolve_device(self.device),
                                     seed=len(self.models))
            else:
                model = specdec.load(name, dtype=self.dtype, quantize=quantize, device=self.device)
            if self.compile:
                model.configure(compile=True)
            self.models[key] = model
        return self.models[key]


def check_models(pool: ModelPool, target: tuple[str, str | None] | None, specs: Sequence[str]) -> None:
    """Every check loading would make on the target (name, quantization) and the model levels of ``specs``,
    made before the first model loads; models already in the pool and random weights are not checked."""
    from specdec.models import check_load

    if pool.random_weights:
        return
    if target is not None and (f"{target[0]}:{target[1]}" if target[1] else target[0]) not in pool.models:
        check_load(target[0], dtype=pool.dtype, quantize=target[1], device=pool.device)
    for spec in specs:
        plan = plan_draft(spec)
        if not any(lv.name in pool.models or f"{lv.name}:{lv.quantize}" in pool.models for lv in plan.levels):
            plan.check(dtype=pool.dtype, device=pool.device)


def build_draft(spec: str, pool: ModelPool, corpus_ids: Sequence[int] | None = None) -> Any:
    """What ``specdec.generate(draft=...)`` takes for ``spec``: a model, a drafter (name or object), or a
    list of them (a hierarchy). Unigram/bigram get ``corpus_ids`` when given."""
    plan = plan_draft(spec).load(get=pool.get)
    levels = [CorpusNGramDrafter(1 if name == "unigram" else 2, corpus_ids)
              if name in ("unigram", "bigram") and corpus_ids else name for name in (lv.name for lv in plan.levels)]
    return levels[0] if len(levels) == 1 else levels


def spec_models(spec: str, pool: ModelPool) -> list[LanguageModel]:
    """The models of a spec, in level order (for measuring their step cost)."""
    return [pool.get(lv.name, lv.quantize) for lv in plan_draft(spec).model_names]


def needs_corpus(specs: Sequence[str]) -> bool:
    """True when some spec has a unigram or bigram level (the only drafts that use a corpus)."""
    return any(name in ("unigram", "bigram") for spec in specs for name in plan_draft(spec).drafter_names)


def corpus_ids(text: str | None, target: LanguageModel) -> list[int] | None:
    """The corpus tokenized with the target's tokenizer (None when there is no corpus)."""
    if not text:
        return None
    # verbose=False: a corpus is longer than the model's context on purpose (it is only counted)
    return list(target.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
