"""A draft resolved once: what ``draft=`` (``--draft``, a served draft, a bench cell) names, parsed into
levels, checked before anything loads, then built into the drafter the decoding loop runs.

    plan = plan_draft("qwen2.5-coder-0.5b:int8<-prompt-lookup")  # two levels, parsed once
    plan.check(dtype="bf16", device="cpu")                         # every check loading would make
    drafter = plan.build(target, inner_gamma=4)                    # load the models, build the drafters

A level is a drafter name (``prompt-lookup``, ``suffix``, ``unigram``, ``bigram``, ``random``), a model source (a
preset, a folder, a hub id, a .gguf file) with its quantization, or an object the user passed (a loaded
model, a :class:`~specdec.drafters.base.Drafter`). The top level drafts for the target; each model level
is drafted for by the levels below it (hierarchical drafting); parameter-free drafters come last. A hierarchy
may copy first (``copy+A<-prompt-lookup``: :mod:`specdec.drafters.copying`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import os
from dataclasses import dataclass
from typing import Any, Callable

from specdec.drafters.base import CORE, Completed, Drafter
from specdec.drafters.hierarchical import SpeculativeDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.names import DRAFTER_NAMES
from specdec.drafters.retokenized import RetokenizedDrafter
from specdec.drafters.spec import (COPY_FIRST, PLAIN, DraftLevel, as_draft_error, format_spec, is_plain, parse_spec,
                                   split_copy_first)
from specdec.errors import SpecDecError

# get(name, quantize) -> a loaded model: how a plan's named model levels load (specdec.load by default; the
# bench passes its pool's, which loads each model once)
ModelGetter = Callable[[str, "str | None"], Any]


def _is_name(source: Any) -> bool:
    return isinstance(source, (str, os.PathLike))


def _names_model(level: DraftLevel) -> bool:
    """True for a level that a model source names (it loads), not a drafter name nor an object."""
    return _is_name(level.name) and str(level.name) not in DRAFTER_NAMES


class DraftKind(str, enum.Enum):
    """What kind of draft a plan is: the one place the CLI, the batch engine and the server ask."""

    PLAIN = "plain"  # no draft: plain decoding
    DRAFTER = "drafter"  # one parameter-free drafter: a name in DRAFTER_NAMES, or a Drafter object
    MODEL = "model"  # one model: a name that loads, or a loaded model
    HIERARCHY = "hierarchy"  # models drafted for by the levels below them, top first


def _is_drafter(source: Any) -> bool:
    """A drafter object (the Drafter protocol, or the earlier releases' start / propose / update), not a model."""
    from specdec.models import Model

    if isinstance(source, Model):
        return False
    return isinstance(source, Drafter) or all(callable(getattr(source, m, None)) for m in CORE)


@dataclass(frozen=True)
class DraftPlan:
    """The levels of a draft, top first (empty: plain decoding). See the module docstring."""

    levels: tuple[DraftLevel, ...] = ()
    copy_first: bool = False  # the top model level copies from the context first (spec prefix "copy+")

    @property
    def plain(self) -> bool:
        return not self.levels

    @property
    def kind(self) -> DraftKind:
        if self.plain:
            return DraftKind.PLAIN
        if len(self.levels) > 1:
            return DraftKind.HIERARCHY
        source = self.levels[0].name
        named_drafter = _is_name(source) and str(source) in DRAFTER_NAMES
        return DraftKind.DRAFTER if named_drafter or _is_drafter(source) else DraftKind.MODEL

    @property
    def model_names(self) -> list[DraftLevel]:
        """The levels a model source names (what :meth:`check` checks and :meth:`load` loads)."""
        return [lv for lv in self.levels if _names_model(lv)]

    @property
    def drafter_names(self) -> list[str]:
        return [str(lv.name) for lv in self.levels if _is_name(lv.name) and str(lv.name) in DRAFTER_NAMES]

    def __str__(self) -> str:
        if self.plain:
            return PLAIN
        return (COPY_FIRST if self.copy_first else "") + format_spec([lv if _is_name(lv.name) else DraftLevel(getattr(lv.name, "name", type(lv.name).__name__), None)
                            for lv in self.levels])

    def check(self, dtype: Any = None, device: Any = None) -> None:
        """Every check loading would make on the named models (unknown names, missing files, unknown
        quantization methods, int8 off the CPU), made before any of them loads."""
        from specdec.models import check_load

        for level in self.model_names:
            try:
                check_load(level.name, dtype=dtype, quantize=level.quantize, device=device)
            except SpecDecError as err:
                raise as_draft_error(err, plain=True) from None

    def load(self, target: Any = None, dtype: Any = None, device: Any = None, compile: bool = False,
             get: ModelGetter | None = None) -> "DraftPlan":
        """This plan with its named models loaded: like ``target`` (its device, its dtype unless ``dtype`` says
        otherwise), each with its level's quantization; without a target (a draft loaded before it), on
        ``device`` in ``dtype``. ``get`` loads a model instead of :func:`specdec.load`."""
        if not self.model_names:
            return self
        from specdec.models import load

        if target is not None:
            dtype = dtype if dtype is not None else target.dtype
            device = target.device
        if get is None:
            def get(name: Any, quantize: str | None) -> Any:
                return load(name, dtype=dtype, quantize=quantize, device=device, compile=compile)
        levels = []
        for level in self.levels:
            if _names_model(level):
                try:
                    model = get(level.name, level.quantize)
                except SpecDecError as err:
                    raise as_draft_error(err, plain=True) from None
                if level.vocabulary is not None:  # a cheaper head over the first N ids (still exact)
                    from specdec.models.quantized.draft_head import restricted_draft

                    model = restricted_draft(model, level.vocabulary)
                level = DraftLevel(model, None)
            levels.append(level)
        return dataclasses.replace(self, levels=tuple(levels))

    @property
    def draft(self) -> Any:
        """What :func:`specdec.generate` takes as ``draft=`` for this plan: None (plain), one level, or a list."""
        if self.plain:
            return None
        out = [lv.name for lv in self.levels]
        return out[0] if len(out) == 1 else out

    def build(self, target: Any, dtype: Any = None, inner_gamma: int = 4) -> Drafter | None:
        """The drafter for ``target``: named models load (:meth:`load`), each level becomes its drafter, and
        every model level above others drafts through a :class:`SpeculativeDrafter` round over them."""
        if self.plain:
            return None
        drafters = [_level_drafter(lv.name, target) for lv in self.load(target, dtype).levels]
        drafter = drafters[-1]
        for top in reversed(drafters[:-1]):
            if isinstance(top, RetokenizedDrafter):
                raise SpecDecError(
                    f"in a hierarchy every level but the last must share the target's tokenizer; {top.name!r} has "
                    "another one: put it last (it drafts text for the level above it)"
                )
            if not isinstance(top, ModelDrafter):
                raise SpecDecError(
                    f"in a hierarchy every level but the last must be a model, got {top.name!r} at a higher "
                    "level; put parameter-free drafters last"
                )
            copy_first = self.copy_first and top is drafters[0]  # (the level that drafts for the target)
            drafter = SpeculativeDrafter(top.model, drafter, inner_gamma, copy_first)
        return drafter


@functools.lru_cache(maxsize=256)
def _parse(spec: str) -> DraftPlan:
    copy_first, rest = split_copy_first(spec)
    plan = DraftPlan(() if is_plain(rest) and not copy_first else tuple(parse_spec(rest)), copy_first)
    if copy_first and plan.kind is not DraftKind.HIERARCHY:  # (parse_spec keeps drafter names off a hierarchy's top)
        raise SpecDecError(f"{COPY_FIRST!r} puts copying from the context in front of a hierarchy's top model, which "
                           f"drafts otherwise; {spec!r} has none: give e.g. "
                           f"{COPY_FIRST}qwen2.5-coder-0.5b<-prompt-lookup")
    return plan


def plan_draft(draft: Any) -> DraftPlan:
    """Resolve what a user passed as ``draft=`` into a :class:`DraftPlan`: None or ``"none"`` (plain
    decoding), a draft specification (``"qwen2.5-coder-0.5b:int8<-prompt-lookup"``, see
    :mod:`specdec.drafters.spec`; each string is parsed once, then cached), a path, a loaded model, a
    :class:`Drafter`, a plan, or a list of these (a hierarchy, top first)."""
    if isinstance(draft, DraftPlan):
        return draft
    if draft is None:
        return DraftPlan()
    if isinstance(draft, str):
        return _parse(draft)
    if isinstance(draft, os.PathLike):
        return DraftPlan((DraftLevel(draft, None),))
    if isinstance(draft, (list, tuple)):
        if not draft:
            raise SpecDecError("draft=[] is empty; give one draft, or a list [model, cheaper draft, ...]")
        levels: list[DraftLevel] = []
        for item in draft:
            sub = plan_draft(item)
            if sub.plain:
                raise SpecDecError(f"'{PLAIN}' (or None) means plain decoding; it cannot be a level of the hierarchy {draft!r}")
            levels.extend(sub.levels)
        for level, below in zip(levels, levels[1:]):
            if _is_name(level.name) and str(level.name) in DRAFTER_NAMES:
                raise SpecDecError(
                    f"in a hierarchy every level but the last must be a model, got {str(level.name)!r} at a higher "
                    f"level (above {getattr(below.name, 'name', below.name)!r}); put parameter-free drafters last"
                )
        return DraftPlan(tuple(levels))
    return DraftPlan((DraftLevel(draft, None),))


def _level_drafter(source: Any, target: Any) -> Drafter:
    """One level's drafter: a drafter name's, a Drafter as given, or a loaded model's (ModelDrafter when it
    shares the target's vocabulary, else RetokenizedDrafter)."""
    from specdec.models import check_same_device, load, same_vocabulary

    if _is_name(source) and str(source) in DRAFTER_NAMES:
        return DRAFTER_NAMES[str(source)]()
    if _is_drafter(source):  # as given, or with the rest defaulted (earlier releases' start / propose / update)
        return source if isinstance(source, Drafter) else Completed(source)
    model = load(source)
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


def make_drafter(draft: Any, target: Any, dtype: Any = None, inner_gamma: int = 4) -> Drafter | None:
    """The drafter for what a user passed as ``draft=`` (see :func:`plan_draft`): ``plan_draft(draft).build``."""
    return plan_draft(draft).build(target, dtype, inner_gamma)


def is_model_spec(spec: Any) -> bool:
    """True when the draft is one model level (transformers' assisted generation can use it)."""
    plan = plan_draft(spec)
    return len(plan.levels) == 1 and bool(plan.model_names)


__all__ = ["DRAFTER_NAMES", "DraftPlan", "is_model_spec", "make_drafter", "plan_draft"]
