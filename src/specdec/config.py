"""One validated configuration for a generation, and the defaults and policies that the Python API, the CLI,
the server and the benchmarks share: none of them re-declares a default.

- Generation settings: the fields of :class:`GenerationConfig`.
- The models: :data:`DEFAULT_TARGET` and :data:`DEFAULT_DRAFT` (declared with the preset catalog),
  :func:`default_target_quantize` (the packaged target runs as an exact quantized target on CPU) and
  :func:`default_draft` (the draft specification used when none is given: on CPU the 0.5B in int4 or int8, itself
  drafted for by prompt lookup; unquantized on CUDA).
- Speculation: every draft, one sequence or a batch, drafts :data:`DEFAULT_GAMMA` tokens a round, constant, unless
  gamma or the schedule is given (adapting from 6 lost to a constant 4 on every CPU measured: docs/cpu_default.md,
  docs/serving.md); the default draft on a CPU where the kernels run their AVX2 code :data:`DEFAULT_GAMMA_AVX2`
  (:func:`default_gamma`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from specdec.errors import SpecDecError
from specdec.models.formats.catalog import DEFAULT_DRAFT, DEFAULT_TARGET  # the packaged pair (same tokenizer)
# the target's quantization when none is asked: the catalog's (load() applies it), named here with the other defaults
from specdec.models.formats.catalog import default_target_quantize
from specdec.sampling import SamplingParams

__all__ = ["DEFAULT_DRAFT", "DEFAULT_GAMMA", "DEFAULT_GAMMA_AVX2", "DEFAULT_TARGET", "MAX_GAMMA_FLOOR",
           "GenerationConfig", "default_draft", "default_gamma", "default_target_quantize"]

# A draft's quantization changes speed and alpha, never the output. On CPU the default draft model runs in int4
# where specdec's kernel runs (AVX-512 VNNI, or AVX2 with the same bits: half int8's bytes, a 0.5B step 0.6-0.7x
# int8's; alpha 0.935 against 0.940 on HumanEval, docs/cpu_default.md), elsewhere in int8 (through fbgemm where the kernels do not run), else unquantized.
DEFAULT_DRAFT_QUANTIZE_CPU = "int8"
DEFAULT_DRAFT_QUANTIZE_KERNELS = "int4"
# On CPU the default draft model is drafted for in turn by prompt lookup (free): a hierarchy (docs/cpu_default.md).
DEFAULT_DRAFT_INNER_CPU = "prompt-lookup"
# ... its head cut to the first 65,536 ids (specdec.models.quantized.draft_head, '@65536' in a spec; exact) where it runs in
# int4: 1.06x and 1.02x the whole head's speed in two runs on the AVX-512 EPYC (alpha 0.928 against 0.945; the int4
# body is cheap, so the head is a larger share of a step), docs/cpu_default.md. The int8 draft keeps its whole head
# (0.97x on a quiet AMX Xeon, alpha 0.926 against 0.947). None: the whole head.
DEFAULT_DRAFT_VOCABULARY_CPU: int | None = None
DEFAULT_DRAFT_VOCABULARY_KERNELS: int | None = 65536
DEFAULT_GAMMA = 4
# Every draft drafts a constant DEFAULT_GAMMA unless told otherwise, one sequence or a batch: adapting from 6 was
# 0.90-0.97x constant 4 for a lone int8 or int4 0.5B on every CPU measured (docs/cpu_default.md, issue 39 point 4), and
# in serve's batch engine 0.91-0.98x constant 4 at 1, 2 and 8 rows (docs/serving.md).
# ... but the default draft drafts DEFAULT_GAMMA_AVX2 where the kernels run their AVX2 code (:func:`default_gamma`): on
# an AVX2-only EPYC (Zen 3) a pass of 5 tokens costs 1.84x a one-token step (2 tokens 1.09x) and the int4 0.5B's step
# 0.47 of one, so through the server gamma 4 lost to plain decoding (0.74-0.96x, two runs of completion and chat) where
# gamma 2 won (1.06-1.19x): docs/serving.md. Since the AVX2 int4 code reads each weight line once for 3 rows too
# (3332ad5), gamma 2's verification of 3 tokens costs ~1.1x a step there (was ~1.4x), and 4 tokens still ~1.6x.
DEFAULT_GAMMA_AVX2 = 2
# The varying schedules' upper bound on gamma when max_gamma is not given: max(MAX_GAMMA_FLOOR, gamma).
MAX_GAMMA_FLOOR = 12


def default_gamma(device: Any = None) -> int:
    """The gamma of the default draft (:func:`default_draft`, :func:`preset_draft`) when none is asked: the CLI, the
    server and the Python API's default draft. :data:`DEFAULT_GAMMA`, but :data:`DEFAULT_GAMMA_AVX2` on a CPU where
    specdec's kernels run their AVX2 code (there a verification of gamma + 1 tokens is dear). A draft named, or a
    :class:`GenerationConfig` built by the caller, keeps its own gamma."""
    from specdec.devices import resolve_device
    from specdec.models.kernels import extension

    if resolve_device(device).type == "cpu" and extension.usable_isa() == "avx2":
        return DEFAULT_GAMMA_AVX2
    return DEFAULT_GAMMA


def default_draft(device: Any = None) -> str:
    """The draft specification used when none is given (CLI, server, the Python API's presets): the 0.5B; on CPU in
    int4 with its head cut to the first 65,536 ids where the CPU has AVX-512 VNNI or AVX2, else int8, with prompt
    lookup drafting for it, copying first (``copy+qwen2.5-coder-0.5b:int4@65536<-prompt-lookup``: where the text
    repeats, a copy of the context goes to the target directly, :mod:`specdec.drafters.copying`). The batch engine
    (``specdec serve --max-batch N``) drafts its rows with the top model (``qwen2.5-coder-0.5b:int4@65536``: 1.09-1.29x
    the int8 0.5B's speed at 1 and 2 rows, 0.96-1.06x at 8: docs/serving.md), and a lone row with all of it."""
    from specdec.devices import resolve_device
    from specdec.drafters.spec import COPY_FIRST
    from specdec.models.kernels import int8_matmul
    from specdec.models.kernels import extension

    if resolve_device(device).type != "cpu":
        return DEFAULT_DRAFT
    kernels = extension.usable_isa() is not None
    quantize = DEFAULT_DRAFT_QUANTIZE_KERNELS if kernels else DEFAULT_DRAFT_QUANTIZE_CPU if int8_matmul.has_fbgemm() else None
    vocabulary = DEFAULT_DRAFT_VOCABULARY_KERNELS if kernels else DEFAULT_DRAFT_VOCABULARY_CPU
    head = f"@{vocabulary}" if vocabulary else ""
    model = f"{DEFAULT_DRAFT}:{quantize}{head}" if quantize else DEFAULT_DRAFT
    return f"{COPY_FIRST}{model}<-{DEFAULT_DRAFT_INNER_CPU}"



DEFAULT = "default"  # draft= left to the default (specdec.generate, generate_batch): :func:`preset_draft`


def preset_draft(target: Any) -> Any:
    """What ``draft="default"`` (the Python API's default) drafts ``target`` with: for the packaged target loaded by
    its preset name, the CLI's and the server's default draft (:func:`default_draft`: on CPU the quantized 0.5B under
    prompt lookup), its models loaded once and kept on the target; any other target: None (plain decoding)."""
    if getattr(target, "preset", None) != DEFAULT_TARGET:
        return None
    if target.default_draft is None:
        from specdec.drafters import plan_draft

        target.default_draft = plan_draft(default_draft(target.device)).load(target)  # (a DraftPlan: copy+ kept)
    return target.default_draft


@dataclass(frozen=True)
class GenerationConfig:
    """Settings of one call to :func:`specdec.generate`.

    gamma: draft tokens proposed per target call (paper's gamma), an integer >= 1. Ignored without a draft.
    temperature: 0 = greedy (argmax, exact token equality with plain greedy decoding); > 0 samples.
    top_k: keep only the k most likely tokens (None: no limit), applied to p and q alike.
    top_p: nucleus sampling mass in (0, 1]; 1.0 disables it.
    max_new_tokens: how many tokens to generate at most (>= 1).
    stop: strings that end the generation; the text is cut before the first one.
    chat: wrap the prompt in the model's chat template (instruct models).
    seed: seed of the single random generator of the run (None: a fresh random seed, reported in the stats).
    gamma_schedule: how gamma varies during decoding (all exact): constant, heuristic, adaptive, confidence
      (see specdec.schedules).
    max_gamma: upper bound of the varying schedules (heuristic, adaptive, confidence); None: max(12, gamma).
    confidence: the confidence schedule's threshold on the draft's top probability, in (0, 1).
    lenience: l in (0, 1] (paper Appendix A.5). 1 is exact; below 1 the output is NOT the target's
      distribution any more (no token gets more than p(x) / l), and the stats say so.
    verification: "token" (Algorithm 1: each drafted token in turn) or "block" (Sun et al. 2025: the block
      as a whole; exact too, never fewer accepted tokens in expectation; the same as "token" at temperature
      0 and for drafts without probabilities). See specdec.acceptance.
    num_beams: beam width w; > 1 runs beam search (specdec.beam), greedy only.
    draft_beams: the draft's beam width u >= w in exact speculative beam search (None: w).
    beam_mode: "exact" (paper A.4: identical to plain beam search) or "report" (the student report's
      Algorithm 2: approximate, labelled so in the output).
    length_penalty, early_stopping: beam search settings, as in transformers.
    json_schema / regex / grammar: structured output (at most one): the output is JSON satisfying the schema (a
      dict or JSON text), matches the regular expression, or derives from the Lark grammar (llguidance's
      syntax). Exact under speculation: p and q are masked alike (specdec.constraints).
    forced_drafts: under a constraint, propose the tokens the grammar forces as a draft before asking the draft
      (specdec.drafters.forced); with a draft only.
    prediction: Predicted Outputs: the text the output is expected to repeat (the code being edited), drafted in
      front of the draft where the output follows it (specdec.drafters.prediction); exact like any draft. An empty
      string is no prediction.
    """

    gamma: int = DEFAULT_GAMMA
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    chat: bool = False
    seed: int | None = None
    gamma_schedule: str = "constant"
    max_gamma: int | None = None
    confidence: float = 0.5
    lenience: float = 1.0
    verification: str = "token"
    num_beams: int = 1
    draft_beams: int | None = None
    beam_mode: str = "exact"
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    json_schema: Any = None
    regex: str | None = None
    grammar: str | None = None
    forced_drafts: bool = True
    prediction: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise SpecDecError(
                f"gamma must be an integer >= 1 (the number of draft tokens per target call), got {self.gamma!r}"
            )
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SpecDecError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is None:
            object.__setattr__(self, "stop", ())
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise SpecDecError(f"stop must be non-empty strings, got {self.stop!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise SpecDecError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None and not -(2 ** 63) <= self.seed < 2 ** 64:
            raise SpecDecError(f"seed must fit in 64 bits (from -2**63 to 2**64 - 1, as torch's generator takes it), "
                               f"got {self.seed}")
        self.sampling  # validates temperature, top_k, top_p
        from specdec.schedules import SCHEDULES

        if self.gamma_schedule not in SCHEDULES:
            raise SpecDecError(f"gamma_schedule must be one of {', '.join(SCHEDULES)}, got {self.gamma_schedule!r}")
        if self.max_gamma is not None and (
            isinstance(self.max_gamma, bool) or not isinstance(self.max_gamma, int) or self.max_gamma < self.gamma
        ):
            raise SpecDecError(f"max_gamma must be an integer >= gamma ({self.gamma}), got {self.max_gamma!r}")
        if not isinstance(self.confidence, (int, float)) or not 0.0 < self.confidence < 1.0:
            raise SpecDecError(f"confidence must be in (0, 1), got {self.confidence!r}")
        if not isinstance(self.lenience, (int, float)) or not 0.0 < self.lenience <= 1.0:
            raise SpecDecError(f"lenience must be in (0, 1] (1 = exact), got {self.lenience!r}")
        from specdec.acceptance import VERIFICATIONS

        if self.verification not in VERIFICATIONS:
            raise SpecDecError(f"verification must be one of {', '.join(VERIFICATIONS)}, got {self.verification!r}")
        if self.verification == "block" and self.lenience < 1.0:
            raise SpecDecError("lenience < 1 is a token-by-token rule: use verification='token' with it")

        if isinstance(self.length_penalty, bool) or not isinstance(self.length_penalty, (int, float)) or not math.isfinite(
                self.length_penalty):
            raise SpecDecError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        if isinstance(self.num_beams, bool) or not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise SpecDecError(f"num_beams must be an integer >= 1, got {self.num_beams!r}")
        if self.draft_beams is not None and (not isinstance(self.draft_beams, int) or self.draft_beams < self.num_beams):
            raise SpecDecError(
                f"draft_beams must be an integer >= num_beams ({self.num_beams}), got {self.draft_beams!r}"
            )
        if self.beam_mode not in ("exact", "report"):
            raise SpecDecError(
                f"unknown beam mode {self.beam_mode!r}: beam_mode must be 'exact' or 'report' ('exact': paper "
                "Appendix A.4, identical to plain beam search; 'report': the report's Algorithm 2, approximate)"
            )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise SpecDecError(f"{name} must be a string, got {type(value).__name__}: {str(value)[:60]!r}")
        if self.json_schema is not None:
            from specdec.constraints.grammar import schema_text

            object.__setattr__(self, "json_schema", schema_text(self.json_schema))
        self.constraint  # validates the schema, regex or grammar (llguidance; before any model runs)
        if not isinstance(self.forced_drafts, bool):
            raise SpecDecError(f"forced_drafts must be True or False, got {self.forced_drafts!r}")
        if self.prediction is not None and not isinstance(self.prediction, str):
            raise SpecDecError(f"prediction must be the expected output's text (a string), got "
                               f"{type(self.prediction).__name__}")
        if self.prediction == "":
            object.__setattr__(self, "prediction", None)  # an empty prediction is no prediction
        if self.early_stopping not in (True, False, "never"):
            raise SpecDecError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if self.num_beams > 1:
            unsupported = [
                name for name, on in (
                    ("temperature > 0", self.temperature > 0 and self.beam_mode == "exact"),
                    ("top_k", self.top_k is not None), ("top_p < 1", self.top_p < 1.0),
                    ("lenience < 1", self.lenience < 1.0), ("stop strings", bool(self.stop)),
                    ("verification='block'", self.verification == "block"),
                    (f"gamma_schedule={self.gamma_schedule}", self.gamma_schedule != "constant"),
                    ("a constraint (json_schema, regex, grammar)", self.constraint is not None),
                    ("a prediction", self.prediction is not None),
                ) if on
            ]
            if unsupported:
                raise SpecDecError(
                    f"beam search (num_beams={self.num_beams}) does not support {', '.join(unsupported)}; "
                    "drop those options or use num_beams=1"
                )

    @property
    def gamma_bound(self) -> int:
        return self.max_gamma if self.max_gamma is not None else max(MAX_GAMMA_FLOOR, self.gamma)

    @property
    def exact(self) -> bool:
        """True when the output follows the target's distribution exactly (no lenience)."""
        return self.lenience == 1.0

    @property
    def constraint(self) -> Any:
        """The :class:`specdec.constraints.Grammar` of json_schema / regex / grammar, or None (compiled once)."""
        if self.json_schema is None and self.regex is None and self.grammar is None:
            return None
        from specdec.constraints.grammar import cached_grammar

        return cached_grammar(self.json_schema, self.regex, self.grammar)

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @classmethod
    def from_options(cls, **options: Any) -> "GenerationConfig":
        """Build from keyword options, ignoring the ones set to None (so callers need no defaults)."""
        known = {f.name for f in fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise SpecDecError(f"unknown generation option(s): {', '.join(sorted(unknown))}")
        return cls(**{k: v for k, v in options.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
