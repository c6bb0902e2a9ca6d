"""The parameter-free drafters by name: what a level of a draft specification (:mod:`specdec.drafters.spec`)
may name instead of a model, and what the plan (:mod:`specdec.drafters.plan`) builds for it."""

from __future__ import annotations

from typing import Callable

from specdec.drafters.base import Drafter
from specdec.drafters.forced import ForcedDrafter
from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter
from specdec.drafters.random_tokens import RandomDrafter
from specdec.drafters.suffix import SuffixDrafter

DRAFTER_NAMES: dict[str, Callable[[], Drafter]] = {
    "prompt-lookup": PromptLookupDrafter,
    "suffix": SuffixDrafter,
    "unigram": lambda: NGramDrafter(order=1),
    "bigram": lambda: NGramDrafter(order=2),
    "random": RandomDrafter,
    "grammar": ForcedDrafter,  # the tokens a constraint forces (specdec.drafters.forced); needs json_schema / regex / grammar
}
