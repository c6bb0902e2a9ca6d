"""The grammar's own draft: under a constraint (JSON schema, regex, grammar), where the grammar forces the next
tokens (an object's keys, brackets, quotes, the rest of an enum value), propose them; elsewhere the wrapped draft
proposes (a model, prompt lookup; none: nothing).

Forced tokens come from llguidance's fast-forward tokens (:meth:`specdec.constraints.Constraint.forced`). They are
proposed as a draft with a one-hot q and verified like any other (never committed unverified: that would not be
exact); where the grammar allows a single token, the masked target gives it probability 1 and it is always
accepted. Counts of what it proposed and what was accepted go to the generation's ``stats.constraint``.
"""

from __future__ import annotations

from typing import Any, Sequence

from specdec.drafters.base import Draft, DraftContext, Drafter, InFront
from specdec.errors import SpecDecError


class ForcedDrafter(InFront):
    """Forced tokens first, ``inner`` for the free parts (``draft="grammar"``: forced tokens only)."""

    def __init__(self, inner: Drafter | None = None):
        self.inner = inner
        self.name = "grammar" if inner is None else f"grammar+{inner.name}"
        self._forced_round = False
        self.proposed = self.accepted = self.rounds = 0

    def start(self, context: DraftContext) -> None:
        super().start(context)
        if context.constraint is None:
            raise SpecDecError("the 'grammar' draft proposes the tokens a constraint forces: give json_schema=, "
                               "regex= or grammar= (--json-schema, --regex, --grammar), or another draft")
        if self.inner is not None:
            self.inner.start(context)
        self.proposed = self.accepted = self.rounds = 0

    def propose(self, sequence: Sequence[int], k: int) -> Draft:
        constraint = self.context.constraint
        forced = constraint.forced() if k > 0 and constraint.depth_of(len(sequence)) == 0 else []
        self._forced_round = bool(forced)
        if forced:
            self.rounds += 1
            self.proposed += min(k, len(forced))
            return Draft.from_ids(forced[:k], self.context.device)
        if self.inner is None:
            return Draft.empty(self.context.device)
        return self.inner.propose(sequence, k)

    def update(self, n_accepted: int) -> None:
        if self._forced_round:
            self.accepted += n_accepted
        elif self.inner is not None:
            self.inner.update(n_accepted)
        self._forced_round = False

    def report(self) -> dict[str, Any]:
        return {"forced_rounds": self.rounds, "forced_proposed": self.proposed, "forced_accepted": self.accepted}



def with_forced(drafter: Drafter) -> ForcedDrafter:
    """``drafter`` behind the grammar's forced tokens (a ForcedDrafter stays as it is)."""
    return drafter if isinstance(drafter, ForcedDrafter) else ForcedDrafter(drafter)
