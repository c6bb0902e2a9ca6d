"""The document ``specdec generate --json`` prints (:meth:`specdec.GenerationOutput.to_dict`), as a JSON Schema.

Written in the subset of JSON Schema (draft 2020-12) that the test suite checks every key and type
against (tests/test_cli.py): ``type`` (one name or a list; "integer" is never a boolean), ``properties``
with ``required`` and ``additionalProperties: false`` (every key is listed, none is left out), ``items``
and ``enum``. Any JSON Schema validator accepts it as it is.
"""

from __future__ import annotations

from typing import Any

_NUMBER = {"type": "number"}
_INTEGER = {"type": "integer"}
_NULLABLE_NUMBER = {"type": ["number", "null"]}


def _object(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties,
            "required": [k for k in properties if k not in optional], "additionalProperties": False}


STATS_SCHEMA = _object({
    "new_tokens": _INTEGER,
    "prompt_tokens": _INTEGER,
    "cached_tokens": _INTEGER,
    "target_calls": _INTEGER,  # serial target forward passes, one per round
    "draft_calls": _INTEGER,  # forward passes of a model draft (0 for parameter-free drafts)
    "drafted": _INTEGER,
    "accepted": _INTEGER,
    "acceptance_rate": _NULLABLE_NUMBER,  # null without drafted tokens
    "acceptance_per_position": {"type": "array", "items": _NUMBER},
    "mean_accepted_length": _NULLABLE_NUMBER,  # tokens per target call, the bonus token included
    "alpha": _NULLABLE_NUMBER,
    "time_draft_s": _NUMBER,
    "time_convert_s": _NUMBER,  # part of time_draft_s: a draft with another tokenizer converting text and tokens
    "time_target_s": _NUMBER,  # the rounds' target passes
    "time_prefill_s": _NUMBER,  # the target's prefill of the prompt
    "time_draft_start_s": _NUMBER,  # part of time_draft_s: the drafter's start (a model draft's prefill)
    "time_other_s": _NUMBER,  # the rest of time_total_s: acceptance, bookkeeping, Python
    "time_total_s": _NUMBER,
    "tokens_per_second": _NULLABLE_NUMBER,
    "seed": _INTEGER,  # the seed the run used (given, or drawn): --seed with it replays the run
    # constraint: a complete grammar that allows no end-of-sequence token ended it (structured output)
    "stop_reason": {"type": "string", "enum": ["eos", "stop", "max_new_tokens", "context", "constraint"]},
    "exact": {"type": "boolean"},
    "not_exact_reason": {"type": ["string", "null"]},
    "levels": {"type": "array", "items": {"type": "object"}},  # hierarchical drafting: one object per level
    "schedule": {"type": "object"},  # the gamma schedule's final state ({} without a draft)
    "rounds_graphed": {"type": "integer"},  # with CUDA graphs: rounds replayed as one captured graph (specdec.round_graph)
    "rounds_chained": {"type": "integer"},  # graphed rounds launched before the previous one was read
    "rounds_per_step": {"type": "integer"},  # with CUDA graphs: rounds that ran step by step (any off the plan)
    "constraint": _object({  # structured output only (specdec.constraints)
        "kind": {"type": "string", "enum": ["json_schema", "regex", "grammar"]},
        "source": {"type": "string"},  # the schema (JSON text), the regex or the grammar
        "complete": {"type": "boolean"},  # the text matches the whole constraint
        "masks": _INTEGER,  # allowed-token sets computed
        "mask_seconds": _NUMBER,  # host time computing them
        "forced_rounds": _INTEGER,  # the grammar's own draft (with a draft): rounds it drafted,
        "forced_proposed": _INTEGER,  # ... the forced tokens it proposed,
        "forced_accepted": _INTEGER,  # ... and those accepted
    }, optional=("forced_rounds", "forced_proposed", "forced_accepted")),
    "prediction": _object({  # Predicted Outputs only (specdec.drafters.prediction), OpenAI's counts and more
        "accepted_prediction_tokens": _INTEGER,  # proposed from the prediction and accepted
        "rejected_prediction_tokens": _INTEGER,  # proposed from it and rejected
        "prediction_rounds": _INTEGER,  # target calls whose draft came from the prediction
        "prediction_tokens": _INTEGER,  # the prediction's length in tokens
    }),
}, optional=("constraint", "prediction"))

CONFIG_SCHEMA = _object({
    "gamma": _INTEGER,
    "temperature": _NUMBER,
    "top_k": {"type": ["integer", "null"]},
    "top_p": _NUMBER,
    "max_new_tokens": _INTEGER,
    "stop": {"type": "array", "items": {"type": "string"}},
    "chat": {"type": "boolean"},
    "seed": {"type": ["integer", "null"]},  # as given (null: drawn, see stats.seed)
    "gamma_schedule": {"type": "string", "enum": ["constant", "heuristic", "adaptive", "confidence"]},
    "max_gamma": {"type": ["integer", "null"]},
    "confidence": _NUMBER,
    "lenience": _NUMBER,
    "verification": {"type": "string", "enum": ["token", "block"]},
    "num_beams": _INTEGER,
    "draft_beams": {"type": ["integer", "null"]},
    "beam_mode": {"type": "string", "enum": ["exact", "report"]},
    "length_penalty": _NUMBER,
    "early_stopping": {"type": ["boolean", "string"]},
    "json_schema": {"type": ["string", "null"]},  # the schema as JSON text
    "regex": {"type": ["string", "null"]},
    "grammar": {"type": ["string", "null"]},
    "forced_drafts": {"type": "boolean"},
    "prediction": {"type": ["string", "null"]},
})

#: The whole document. "extra" appears only with beam search (num_beams > 1).
GENERATION_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "specdec generate --json",
    **_object({
        "text": {"type": "string"},  # the generated text, cut before a stop string
        "token_ids": {"type": "array", "items": _INTEGER},  # generated tokens, EOS included when it ended the run
        "from_draft": {"type": "array", "items": {"type": "boolean"}},  # per token: accepted from the draft
        "stats": STATS_SCHEMA,
        "config": CONFIG_SCHEMA,
        "extra": {"type": "object"},
    }, optional=("extra",)),
}
