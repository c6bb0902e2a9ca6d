"""The public entry point: beam search with the target alone, or speculatively with a draft."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from specdec.beam.drafts import make_beam_draft
from specdec.beam.exact import exact_beam_search
from specdec.beam.report import report_beam_search
from specdec.config import GenerationConfig
from specdec.devices import Stopwatch, new_generator
from specdec.errors import SpecDecError
from specdec.models import LanguageModel
from specdec.models.causal import new_token_limit

MODES = ("exact", "report")


@dataclass
class BeamOutput:
    token_ids: list[int]  # the best hypothesis' generated tokens (EOS included when it ended with EOS)
    score: float  # its score: sum of log-probabilities / length ** length_penalty
    stats: dict[str, Any] = field(default_factory=dict)


def beam_search(
    target: LanguageModel,
    prompt_ids: Sequence[int],
    *,
    num_beams: int,
    max_new_tokens: int,
    draft: Any = None,
    draft_beams: int | None = None,
    gamma: int = GenerationConfig.gamma,
    mode: str = "exact",
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_ids: set[int] | None = None,
    seed: int | None = None,
) -> BeamOutput:
    """Beam search of width ``num_beams`` with the target, speculatively when ``draft`` is given.

    target: a decoder-only :class:`LanguageModel`; prompt_ids: the prompt's token ids.
    draft: None (plain beam search), a model, a :class:`~specdec.drafters.ModelDrafter`, or a drafter
      that gives probabilities (``"bigram"``, ``"unigram"``, an :class:`~specdec.drafters.NGramDrafter`).
    draft_beams: u >= num_beams, the draft's beam width (default num_beams); gamma: draft steps per round
      (default: GenerationConfig's).
    mode: ``"exact"``: the output equals plain beam search token for token (paper Appendix A.4, see the
      module docstring); ``"report"``: the report's Algorithm 2, approximate (``stats["exact"]`` False).
    length_penalty, early_stopping: as in transformers' ``generate``.
    eos_token_ids: default the target's. seed: the random source of report mode (and of drafters).

    Plain and exact modes equal transformers' ``generate(num_beams=w, do_sample=False, ...)``.
    """
    # The same validation, messages and defaults as every other generation (specdec.config).
    GenerationConfig(num_beams=num_beams, draft_beams=draft_beams, gamma=gamma, beam_mode=mode,
                     max_new_tokens=max_new_tokens, length_penalty=length_penalty, early_stopping=early_stopping)
    if target.is_encoder_decoder:
        raise SpecDecError("beam search supports decoder-only targets; this target is an encoder-decoder model")
    device = target.device
    prompt = torch.tensor([int(t) for t in prompt_ids], dtype=torch.long, device=device)  # [P]
    limit = new_token_limit(prompt.numel(), max_new_tokens, target.max_context, target.name)
    eos = set(target.eos_token_ids if eos_token_ids is None else eos_token_ids)
    seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
    generator = new_generator(device, seed)
    clock = Stopwatch(device)
    kind, draft_obj = make_beam_draft(draft, target, mode)

    stats: dict[str, Any] = {
        "mode": "plain" if kind is None and mode == "exact" else mode,
        "exact": mode == "exact",
        "num_beams": num_beams,
        "draft_beams": (draft_beams or num_beams) if kind is not None and mode == "exact" else None,
        "gamma": gamma if kind is not None else None,
        "prompt_tokens": int(prompt.numel()),
        "target_calls": 0,  # serial target forward passes, the prefill included
        "draft_calls": 0,  # forward passes of a draft model (0 for parameter-free drafts)
        "target_positions": 0,  # positions the target computed (batch x length summed): its total work
        "steps": 0,  # beam steps (tokens added to the running beams)
        "rounds": 0,  # speculative passes (exact mode) / beam iterations (report mode)
        "time_draft_s": 0.0,
        "time_target_s": 0.0,
        "seed": seed,
    }
    exact = mode == "exact"
    stats["drafted_steps"] = 0 if exact else None  # exact: tree levels 1..gamma offered by the draft
    stats["accepted_steps"] = 0 if exact else None  # exact: beam steps computed from those levels
    stats["drafted_tokens"] = None if exact else 0  # report: tokens drafted over all sampling chains
    stats["accepted_tokens"] = None if exact else 0  # report: of which accepted
    t_start = clock()
    with torch.inference_mode():
        if mode == "report":
            tokens, score = report_beam_search(
                target, prompt, num_beams, limit, kind, draft_obj, gamma, length_penalty, eos, generator, stats, clock
            )
        else:
            tokens, score = exact_beam_search(
                target, prompt, num_beams, draft_beams or num_beams, limit, kind, draft_obj, gamma,
                length_penalty, early_stopping, eos, generator, stats, clock,
            )
    stats["time_total_s"] = clock() - t_start
    stats["new_tokens"] = len(tokens)
    drafted, accepted = ("drafted_steps", "accepted_steps") if exact else ("drafted_tokens", "accepted_tokens")
    stats["acceptance_rate"] = stats[accepted] / stats[drafted] if stats[drafted] else None
    stats["steps_per_target_call"] = stats["steps"] / stats["target_calls"] if stats["target_calls"] else None
    if tokens and tokens[-1] in eos:
        stats["stop_reason"] = "eos"
    else:
        stats["stop_reason"] = "max_new_tokens" if len(tokens) >= max_new_tokens else "context"
    return BeamOutput(tokens, score, stats)

