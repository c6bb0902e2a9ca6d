"""What a generation must match: a JSON schema, a regular expression or a grammar, checked before any model runs.

The three are compiled to one llguidance grammar (https://github.com/guidance-ai/llguidance):

- ``json_schema``: a JSON schema (a dict or its JSON text); the output is JSON that satisfies it, on one line as
  ``json.dumps`` writes it (:data:`JSON_LAYOUT`; a schema's ``"x-guidance"`` object overrides it). llguidance
  supports the schema keywords its docs list (types, properties, required, enum, const, anyOf, items,
  min/max bounds, string formats and patterns, ``$ref``); an unsupported keyword is an error, never ignored.
- ``regex``: a regular expression the whole output matches (Rust regex syntax, no look-around).
- ``grammar``: a context-free grammar in llguidance's Lark syntax (``start: ...``; terminals may be regexes
  ``/.../``, and ``%json {schema}`` embeds a JSON schema). https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md

Choice of library (measured, docs/structured_output.md): llguidance and xgrammar both roll back, mask in
microseconds per token on this CPU (a few hundredths of a model step), and cover JSON schema and regular
expressions; llguidance also returns the forced tokens (``compute_ff_tokens``: what the grammar's own draft
proposes), takes Lark grammars, pulls no GPU toolchain, and names the error's place in the source.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from specdec.errors import SpecDecError

KINDS = ("json_schema", "regex", "grammar")
# JSON is written on one line as Python's json.dumps writes it (", " and ": ", no other whitespace): the layout models
# write, and no run of whitespace a small model can loop in. A schema's "x-guidance" object overrides it, e.g.
# {"x-guidance": {"whitespace_flexible": true}} (any JSON whitespace).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
INSTALL = "pip install 'llguidance>=1.9,<2' (a dependency of specdec: reinstall specdec)"


def llguidance_module() -> Any:
    """The llguidance package, or a clear error naming the install command."""
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover - the package is a dependency; this guards broken installs
        raise SpecDecError(f"structured output needs the llguidance package: {INSTALL}") from e
    return llguidance


@dataclass(frozen=True)
class Grammar:
    """A validated constraint. kind: one of KINDS; source: what the user gave (a schema's JSON text, the regex,
    the Lark text); compiled: the llguidance grammar (its JSON form) that matchers are built from."""

    kind: str
    source: str
    compiled: str

    @property
    def label(self) -> str:
        """How messages name it: 'the JSON schema', 'the regular expression', 'the grammar'."""
        return {"json_schema": "the JSON schema", "regex": "the regular expression", "grammar": "the grammar"}[self.kind]

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "source": self.source}


def schema_text(schema: Any) -> str:
    """A JSON schema (dict, or JSON text of an object) as JSON text; anything else is an error that says what."""
    if isinstance(schema, (bytes, bytearray)):
        schema = schema.decode("utf-8", errors="replace")
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except json.JSONDecodeError as e:
            raise SpecDecError(f"the JSON schema is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                               "give a JSON object such as {\"type\": \"object\"}") from None
    else:
        parsed = schema
    if isinstance(parsed, bool):
        parsed = {} if parsed else {"not": {}}
    if not isinstance(parsed, dict):
        raise SpecDecError(f"a JSON schema must be a JSON object (a dict), got {type(parsed).__name__}: "
                           f"{str(parsed)[:60]!r}")
    try:
        return json.dumps(parsed, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise SpecDecError(f"the JSON schema cannot be written as JSON: {e}") from None


def make_grammar(json_schema: Any = None, regex: str | None = None, grammar: str | None = None) -> Grammar | None:
    """The validated :class:`Grammar` of at most one of the three (None when none is given). Raises
    :class:`SpecDecError` naming the problem (and where in the source) for an invalid one: no model has run yet."""
    given = [(k, v) for k, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        raise SpecDecError(f"give one constraint, not {' and '.join(k for k, _ in given)}: a JSON schema, a regex "
                           "or a grammar (a Lark grammar can combine them: %json {...} and /regex/ terminals)")
    kind, value = given[0]
    ll = llguidance_module()
    if kind == "json_schema":
        source = schema_text(value)
        try:
            compiled = ll.LLMatcher.grammar_from_json_schema(source, defaults=JSON_LAYOUT)
        except ValueError as e:
            raise SpecDecError(f"the JSON schema is invalid: {e}") from None
    else:
        if not isinstance(value, str) or not value.strip():
            raise SpecDecError(f"{kind} must be a non-empty string, got {value!r}")
        source = value
        compiled = (ll.LLMatcher.grammar_from_regex(value) if kind == "regex"
                    else ll.LLMatcher.grammar_from_lark(value))
    out = Grammar(kind, source, compiled)
    is_error, messages = ll.LLMatcher.validate_grammar_with_warnings(compiled)
    if is_error:
        raise SpecDecError(f"{out.label} is invalid: {' '.join(messages).strip()}")
    return out


@functools.lru_cache(maxsize=64)
def cached_grammar(json_schema: str | None, regex: str | None, grammar: str | None) -> Grammar | None:
    """:func:`make_grammar` of hashable sources (a schema as JSON text), compiled once per source."""
    return make_grammar(json_schema, regex, grammar)
