"""The models of a ``specdec`` command line: the draft specification and the target's quantization that
its options give, every check loading would make (before anything loads), and the loading itself."""

from __future__ import annotations

import argparse
from typing import Any


def draft_spec(args: argparse.Namespace) -> str:
    """--draft (levels of repeated options joined as a hierarchy) with --draft-quantize applied, or the
    default draft ('none' for plain decoding). Without --draft, --draft-quantize quantizes the default
    draft model (none: unquantized); without either, the device's default draft."""
    from specdec.config import DEFAULT_DRAFT, default_draft
    from specdec.drafters.spec import PLAIN, is_plain, join_levels, with_default_quantization
    from specdec.models.quantized.int8_weights import check_method

    method = args.draft_quantize
    method = None if method is None or str(method).lower() == "none" else method
    if method is not None:
        check_method(method)
    if args.draft:
        spec = join_levels(args.draft)
    else:  # (specdec serve's batch engine too: its rows draft with the top model, a lone row with all of it)
        spec = default_draft(args.device) if args.draft_quantize is None else DEFAULT_DRAFT
    if is_plain(spec):
        return PLAIN
    return with_default_quantization(spec, method)


def gamma_of(args: argparse.Namespace) -> int | None:
    """--gamma; not given, with the default draft, that draft's gamma on --device (:func:`specdec.config.default_gamma`:
    lower where the kernels run their AVX2 code); None (the config's default) with a draft named."""
    if args.gamma is not None or args.draft:
        return args.gamma
    from specdec.config import default_gamma

    return default_gamma(args.device)


def target_quantization(args: argparse.Namespace) -> str | None:
    """--quantize: 'none' leaves the target as it is; not given, the default (:func:`specdec.config.
    default_target_quantize`: the packaged target in int8 on CPU)."""
    from specdec.config import default_target_quantize
    from specdec.errors import SpecDecError

    if args.quantize is None:
        return default_target_quantize(args.target, args.device, args.dtype)
    method = None if str(args.quantize).lower() == "none" else args.quantize
    if method == "llama-cpp":
        raise SpecDecError("--quantize llama-cpp: llama.cpp runs drafts only (its multi-token passes are not "
                           "block-invariant); use --quantize int8 for the target and :llama-cpp on a --draft level")
    return method


def check_models(args: argparse.Namespace) -> None:
    """Every check on --target, --draft, --dtype, --quantize, --draft-quantize, --device and --compile
    that loading would make, made before any model loads (a 1.5B target takes seconds to load): unknown
    names, missing files, a file where a folder is expected, unknown dtypes and quantization methods,
    int8 off the CPU, a hierarchy with a parameter-free drafter above a model."""
    from specdec.devices import resolve_device
    from specdec.drafters import plan_draft
    from specdec.errors import SpecDecError
    from specdec.models import check_load

    if args.compile and resolve_device(args.device).type != "cuda":
        raise SpecDecError("--compile compiles the captured CUDA-graph steps: it needs a CUDA device "
                           "(--device cuda); drop --compile on CPU")
    check_load(args.target, dtype=args.dtype, quantize=target_quantization(args), device=args.device)
    plan_draft(draft_spec(args)).check(dtype=args.dtype, device=args.device)


def load_models(args: argparse.Namespace, target_tokenizer: Any = None):
    """(target, draft) as --target, --draft, --dtype, --quantize, --draft-quantize and --device say;
    ``target_tokenizer``: the target's tokenizer when it was already read (by check_prompt).

    The draft loads first, on the device and in the dtype the target will have: an int8 draft packs its
    weights on background threads (specdec.models.quantized.quantize), which then overlaps the target's load. Both
    are ready when this returns; each model's ``load_seconds`` says how long its own load took."""
    import specdec
    from specdec.devices import resolve_device
    from specdec.drafters import plan_draft
    from specdec.models import Model, load_dtype
    from specdec.models.quantized.quantize import wait_packed

    quantize = target_quantization(args)
    plan = plan_draft(draft_spec(args)).load(dtype=args.dtype if args.dtype is not None else load_dtype(None, quantize),
                                             device=resolve_device(args.device), compile=bool(args.compile))
    # what generate(draft=) takes: the loaded model (or levels) as before, the plan where it copies first (its levels
    # alone would drop copy+)
    draft = plan if plan.copy_first else plan.draft
    # the dtype as load() would take it (float models: bf16), given: --quantize none loads the float target
    target = specdec.load(args.target, dtype=load_dtype(args.dtype, quantize), quantize=quantize, device=args.device,
                          compile=bool(args.compile), tokenizer=target_tokenizer)
    for level in plan.levels:
        level = level.name
        if isinstance(level, Model) and level.hf_model is not None:
            wait_packed(level.hf_model)
    return target, draft


def native_models(args: argparse.Namespace):
    """Around ``specdec generate``'s loads: its stored int8 / int4 presets load into specdec's own model of their
    architecture (:mod:`specdec.models.native.causal_lm`: the same bits, without the seconds that importing transformers'
    model code takes) where the generation is one sequence (not a beam search, which batches its beams)."""
    import contextlib

    from specdec.models.native import causal_lm

    return causal_lm.skeletons() if (getattr(args, "num_beams", None) or 1) == 1 else contextlib.nullcontext()


def draft_label(draft) -> str:
    from specdec.drafters import DraftPlan
    from specdec.drafters.spec import COPY_FIRST

    if draft is None:
        return "none"
    if isinstance(draft, DraftPlan):
        return (COPY_FIRST if draft.copy_first else "") + draft_label(draft.draft)
    return " <- ".join(getattr(d, "name", str(d)) for d in (draft if isinstance(draft, list) else [draft]))
