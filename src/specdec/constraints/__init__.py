"""Structured output: generations that match a JSON schema, a regular expression or a grammar, exactly under
speculation.

- :mod:`specdec.constraints.grammar`: the user's constraint, validated and compiled (llguidance) before any model runs;
- :mod:`specdec.constraints.matcher`: one generation's place in it, the allowed tokens at each drafted depth, and
  rollback of the rejected drafts;
- the grammar's own draft (forced tokens) is a drafter: :mod:`specdec.drafters.forced`.

    specdec.generate(target, "Extract the person: ...", draft="qwen2.5-coder-0.5b",
                     json_schema={"type": "object", "properties": {"name": {"type": "string"}}})
"""

from __future__ import annotations

from specdec.constraints.grammar import KINDS, Grammar, make_grammar
from specdec.constraints.matcher import Constraint

__all__ = ["KINDS", "Constraint", "Grammar", "make_grammar"]
