"""The draft specification: one string names a draft in the Python API, the CLI, the server and the benchmarks.

    SPEC  := ["copy+"] LEVEL ("<-" LEVEL)*
                                      a hierarchy: each model level is drafted for by the next; "copy+": copying
                                      first, the top model level proposes a copy of the context to the target
                                      directly where the text repeats (specdec.drafters.copying; needs a hierarchy)
    LEVEL := NAME [":" QUANT] ["@" N] NAME: a model (preset, folder, hub id, .gguf) or a parameter-free
                                      drafter (prompt-lookup, suffix, unigram, bigram, random, grammar); QUANT: int8,
                                      int8-tensor, int4 (AVX-512 VNNI / AVX2) or llama-cpp (model levels
                                      only; without it the model runs unquantized; llama-cpp: its GGUF in
                                      llama.cpp); N: the model
                                      drafts from its vocabulary's first N ids only (and its end-of-sequence
                                      ids; a cheaper head, still exact: specdec.models.quantized.draft_head), e.g. 65536

The grammar only; :mod:`specdec.drafters.plan` resolves a spec (or any ``draft=``) once into the plan that
is checked, loaded and built. E.g. ``qwen2.5-coder-0.5b``, ``qwen2.5-coder-0.5b:int8``, ``qwen2.5-coder-0.5b:int8<-prompt-lookup`` (quote
it in a shell), ``bigram``, ``smollm2-135m:int8`` (a draft with another tokenizer). ``none`` means plain
decoding where a draft may be chosen (the CLI, the server).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

from specdec.errors import SpecDecError

COPY_FIRST = "copy+"  # the prefix of a hierarchy that copies first (specdec.drafters.copying)
QUANTIZATIONS = ("int8", "int8-tensor", "int4", "int4-mixed", "llama-cpp")  # llama-cpp: the GGUF run by llama.cpp
HIERARCHY_ARROW = "<-"
PLAIN = "none"  # no draft: plain decoding


class DraftLevel(NamedTuple):
    name: str  # a model or a parameter-free drafter
    quantize: str | None  # int8 / int8-tensor / int4 / llama-cpp for a model level, else None
    vocabulary: int | None = None  # a model level's head keeps the first N ids (None: all of them)


def _drafter_names() -> Any:
    from specdec.drafters.names import DRAFTER_NAMES

    return DRAFTER_NAMES


def as_draft_error(err: SpecDecError, plain: bool = False) -> SpecDecError:
    """``err`` (a model that could not be found or loaded) as a draft's error: it names what else a draft
    may be (the parameter-free drafters, and ``none`` where plain decoding can be chosen)."""
    names = [*_drafter_names(), *([PLAIN] if plain else [])]
    return SpecDecError(f"{err} (as a draft, also accepted: {', '.join(names)})")


def split_copy_first(spec: str) -> tuple[bool, str]:
    """``"copy+a<-b"`` -> ``(True, "a<-b")``; a spec without the prefix -> ``(False, spec)``."""
    stripped = spec.strip()
    return (True, stripped[len(COPY_FIRST):]) if stripped.startswith(COPY_FIRST) else (False, spec)


def parse_spec(spec: str) -> list[DraftLevel]:
    """``"a:int8<-b"`` -> ``[DraftLevel("a", "int8"), DraftLevel("b", None)]``, checked: no empty level, no
    quantized drafter, parameter-free drafters last."""
    drafters = _drafter_names()
    if not isinstance(spec, str) or not spec.strip():
        raise SpecDecError(f"empty draft specification {spec!r}; give e.g. qwen2.5-coder-0.5b:int8 or prompt-lookup")
    spec = split_copy_first(spec)[1]  # (copying first is the plan's: specdec.drafters.plan)
    levels = []
    for part in spec.split(HIERARCHY_ARROW):
        part = part.strip()
        vocabulary = None
        head, sep, tail = part.rpartition("@")
        if sep and tail.strip().isdigit():
            part, vocabulary = head.strip(), int(tail)
        name, quant = part, None
        head, sep, tail = part.rpartition(":")
        if sep and tail in QUANTIZATIONS:
            name, quant = head.strip(), tail
        if not name:
            raise SpecDecError(f"draft specification {spec!r} has an empty level")
        if quant is not None and name in drafters:
            raise SpecDecError(f"{name!r} has no weights to quantize (in {spec!r}); drop :{quant}")
        if vocabulary is not None and (name in drafters or quant == "llama-cpp"):
            raise SpecDecError(f"{name}{':' + quant if quant else ''} has no LM head of specdec's to cut (in {spec!r}); "
                               f"drop @{vocabulary}")
        levels.append(DraftLevel(name, quant, vocabulary))
    if len(levels) > 1 and any(level.name.lower() == PLAIN for level in levels):
        raise SpecDecError(f"'{PLAIN}' means plain decoding; it cannot be part of the hierarchy {spec!r}")
    for level, below in zip(levels, levels[1:]):
        if level.name in drafters:
            raise SpecDecError(
                f"in the hierarchy {spec!r} every level but the last must be a model; put {level.name!r} last "
                f"(it stands before {below.name!r}): parameter-free drafters draft for the model above them"
            )
    return levels


def join_levels(parts: Sequence[str]) -> str:
    """Several specs (the CLI's repeated --draft) as one hierarchy: ``["a", "b"]`` -> ``"a<-b"``."""
    return HIERARCHY_ARROW.join(p.strip() for p in parts)


def format_spec(levels: Sequence[DraftLevel]) -> str:
    def level(lv: DraftLevel) -> str:
        return (f"{lv.name}:{lv.quantize}" if lv.quantize else str(lv.name)) + (f"@{lv.vocabulary}" if lv.vocabulary else "")

    return HIERARCHY_ARROW.join(level(lv) for lv in levels)


def with_default_quantization(spec: str, quantize: str | None) -> str:
    """``spec`` with ``quantize`` on each model level that names none (the CLI's --draft-quantize)."""
    if quantize is None:
        return spec
    drafters = _drafter_names()
    return (COPY_FIRST if split_copy_first(spec)[0] else "") + format_spec([DraftLevel(lv.name, lv.quantize or (None if lv.name in drafters else quantize), lv.vocabulary)
                        for lv in parse_spec(spec)])


def is_plain(spec: str | None) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() == PLAIN)
