"""Drafters: the approximation models M_q that propose tokens for the target to verify.

Built in: a smaller model with the target's tokenizer, a model with another tokenizer (it drafts
text, see :mod:`specdec.drafters.retokenized`), prompt lookup (copy from the context), unigram and
bigram models, and random tokens. Your own: subclass :class:`~specdec.drafters.base.DrafterBase` and write
``propose`` (the protocol: :class:`~specdec.drafters.base.Drafter`).
"""

from __future__ import annotations

from typing import Any

from specdec.drafters.base import CORE, Completed, Draft, DraftContext, Drafter, DrafterBase, DrafterStats
from specdec.drafters.hierarchical import SpeculativeDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter, find_continuation
from specdec.drafters.random_tokens import RandomDrafter
from specdec.drafters.retokenized import RetokenizedDrafter
from specdec.drafters.spec import as_draft_error, is_spec, load_draft
from specdec.errors import SpecDecError

__all__ = [
    "Draft", "DraftContext", "Drafter", "DrafterBase", "DrafterStats", "ModelDrafter", "NGramDrafter",
    "PromptLookupDrafter", "RandomDrafter", "RetokenizedDrafter", "SpeculativeDrafter", "find_continuation", "make_drafter", "DRAFTER_NAMES",
]

DRAFTER_NAMES = {
    "prompt-lookup": PromptLookupDrafter,
    "unigram": lambda: NGramDrafter(order=1),
    "bigram": lambda: NGramDrafter(order=2),
    "random": RandomDrafter,
}


def make_drafter(spec: Any, target: Any, dtype: Any = None, inner_gamma: int = 4) -> Drafter | None:
    """Turn what a user passed as ``draft=`` into a drafter.

    spec: None (plain decoding), a drafter name (``prompt-lookup``, ``unigram``, ``bigram``,
    ``random``), a loaded model, anything :func:`specdec.load` accepts (a preset name, a folder...),
    a draft specification (``"qwen2.5-coder-0.5b:int8<-prompt-lookup"``, see :mod:`specdec.drafters.spec`),
    a ready :class:`Drafter`, or a list of these for hierarchical drafting: ``[M_1, M_2, ...]`` where
    each model level is accelerated by the levels after it (all but the last must be models).
    A model whose tokenizer differs from the target's drafts text (:class:`RetokenizedDrafter`); in a
    hierarchy it can only be the last level.
    """
    from specdec.models import LanguageModel, check_same_device, load, same_vocabulary

    if spec is None:
        return None
    if is_spec(spec):  # a hierarchy or a quantized level, written as one string
        return make_drafter(load_draft(spec, target, dtype), target, dtype, inner_gamma)
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise SpecDecError("draft=[] is empty; give one draft, or a list [model, cheaper draft, ...]")
        if len(spec) == 1:
            return make_drafter(spec[0], target, dtype, inner_gamma)
        top = make_drafter(spec[0], target, dtype, inner_gamma)
        if isinstance(top, RetokenizedDrafter):
            raise SpecDecError(
                f"in a hierarchy every level but the last must share the target's tokenizer; {top.name!r} has "
                "another one: put it last (it drafts text for the level above it)"
            )
        if not isinstance(top, ModelDrafter):
            raise SpecDecError(
                f"in a hierarchy every level but the last must be a model, got {getattr(top, 'name', spec[0])!r} "
                "at a higher level; put parameter-free drafters last"
            )
        return SpeculativeDrafter(top.model, make_drafter(list(spec[1:]), target, dtype, inner_gamma), inner_gamma)
    if isinstance(spec, str) and spec in DRAFTER_NAMES:
        return DRAFTER_NAMES[spec]()
    if isinstance(spec, Drafter) and not isinstance(spec, LanguageModel):
        return spec
    if all(callable(getattr(spec, m, None)) for m in CORE):
        return Completed(spec)  # start / propose / update only (earlier releases' protocol): the rest defaults
    if isinstance(spec, str):
        try:
            spec = load(spec, dtype=dtype if dtype is not None else target.dtype, device=target.device)
        except SpecDecError as err:
            raise as_draft_error(err) from None
    model = load(spec)
    if model.is_encoder_decoder != target.is_encoder_decoder:
        kinds = {True: "an encoder-decoder", False: "a decoder-only"}
        raise SpecDecError(
            f"the draft {model.name!r} is {kinds[model.is_encoder_decoder]} model but the target is "
            f"{kinds[target.is_encoder_decoder]} model; use a draft of the same kind, or a parameter-free "
            f"draft ({', '.join(DRAFTER_NAMES)})"
        )
    check_same_device(target, model)
    for who, m in (("draft", model), ("target", target)):
        if getattr(m, "tokenizer", None) is None:
            raise SpecDecError(
                f"the {who} {m.name!r} has no tokenizer: specdec compares the draft's tokenizer with the target's "
                "(and a draft with another one drafts text); load it with its tokenizer: specdec.load(model, tokenizer=tok)"
            )
    if same_vocabulary(target, model):
        return ModelDrafter(model)
    if target.is_encoder_decoder:
        raise SpecDecError(
            f"the draft {model.name!r} does not share the target's vocabulary (an encoder-decoder target): a draft "
            "with another tokenizer needs a decoder-only target"
        )
    return RetokenizedDrafter(model, target.tokenizer)
