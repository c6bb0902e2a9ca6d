"""Drafters: the approximation models M_q that propose tokens for the target to verify.

Built in: a smaller model with the target's tokenizer, a model with another tokenizer (it drafts
text, see :mod:`specdec.drafters.retokenized`), prompt lookup (copy from the context), the suffix draft
(continue the longest repeated suffix as it most often went on), unigram and
bigram models, and random tokens. Your own: subclass :class:`~specdec.drafters.base.DrafterBase` and write
``propose`` (the protocol: :class:`~specdec.drafters.base.Drafter`).
"""

from __future__ import annotations

from specdec.drafters.base import Draft, DraftContext, Drafter, DrafterBase, DrafterStats
from specdec.drafters.hierarchical import SpeculativeDrafter
from specdec.drafters.model import ModelDrafter
from specdec.drafters.ngram import NGramDrafter
from specdec.drafters.prompt_lookup import PromptLookupDrafter, find_continuation
from specdec.drafters.random_tokens import RandomDrafter
from specdec.drafters.retokenized import RetokenizedDrafter
from specdec.drafters.suffix import SuffixDrafter, suffix_continuation
from specdec.drafters.plan import DRAFTER_NAMES, DraftKind, DraftPlan, make_drafter, plan_draft

__all__ = [
    "Draft", "DraftContext", "DraftKind", "DraftPlan", "Drafter", "DrafterBase", "DrafterStats", "ModelDrafter", "NGramDrafter",
    "PromptLookupDrafter", "RandomDrafter", "RetokenizedDrafter", "SpeculativeDrafter", "SuffixDrafter", "find_continuation", "suffix_continuation", "make_drafter", "plan_draft", "DRAFTER_NAMES",
]
