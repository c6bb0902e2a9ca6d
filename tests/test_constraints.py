"""Structured output (specdec.constraints): outputs satisfy their constraint, speculation under a constraint is exact
(greedy: token-identical to constrained plain decoding; T = 1: the masked target law), the matcher rolls back
rejected drafts, and bad constraints are clear errors before any model runs.

Tiny random models over a character vocabulary (tests/tiny.py: every printable ASCII character is a token), so
any JSON text is expressible and a run takes milliseconds.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

import specdec
from specdec.constraints import Constraint, make_grammar
from specdec.drafters.base import Draft, DrafterBase
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams, standardize
from stats_util import chi_square_pvalue
from tiny import CHAR_VOCAB, load_tiny_chars, perturbed

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "points": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": -5,
                                                                           "maximum": 5}, "maxItems": 3},
                   "maxItems": 3},
        "ok": {"type": "boolean"},
        "level": {"type": "integer", "minimum": 10, "maximum": 20},
    },
    "required": ["points", "ok", "level"],
    "additionalProperties": False,
}
ENUM_ONLY = {"enum": ["north", "south", "east", "west"]}
SCHEMAS = {"person": PERSON, "nested": NESTED, "enum": ENUM_ONLY}


@pytest.fixture(scope="module")
def target():
    return load_tiny_chars(sharp=3.0, seed=0)


@pytest.fixture(scope="module")
def draft(target):
    return perturbed(target, 0.3, seed=5)


# -- outputs satisfy their constraint ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SCHEMAS))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_parse_and_satisfy_their_schema(target, draft, name, temperature):
    schema = SCHEMAS[name]
    for seed in range(4):
        out = specdec.generate(target, "x=", draft=draft, json_schema=schema, max_new_tokens=200,
                               temperature=temperature, seed=seed)
        assert out.stats.stop_reason == "eos", out.text
        jsonschema.validate(json.loads(out.text), schema)
        assert out.stats.constraint["complete"] is True


def test_a_regex_is_matched_whole(target, draft):
    import re

    pattern = r"[a-f]{3}-[0-9]{2,4}"
    for seed in range(4):
        out = specdec.generate(target, "id:", draft=draft, regex=pattern, temperature=1.0, seed=seed)
        assert re.fullmatch(pattern, out.text), out.text


def test_a_lark_grammar(target, draft):
    grammar = 'start: "(" num (op num)* ")"\nop: "+" | "*"\nnum: /[1-9][0-9]?/'
    out = specdec.generate(target, "expr:", draft=draft, grammar=grammar, temperature=1.0, seed=2, max_new_tokens=60)
    import re

    assert re.fullmatch(r"\([1-9][0-9]?([+*][1-9][0-9]?)*\)", out.text), out.text


# -- greedy speculation under a constraint is plain constrained decoding, token for token ---------------------------
@pytest.mark.parametrize("kind", ["model", "prompt-lookup", "grammar", "hierarchy", "model-no-forced"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_greedy_speculative_equals_greedy_plain_under_the_constraint(target, draft, kind, name):
    schema = SCHEMAS[name]
    plain = specdec.generate(target, "x=", json_schema=schema, max_new_tokens=120)
    spec_draft = {"model": draft, "prompt-lookup": "prompt-lookup", "grammar": "grammar",
                  "hierarchy": [draft, "prompt-lookup"], "model-no-forced": draft}[kind]
    out = specdec.generate(target, "x=", draft=spec_draft, json_schema=schema, max_new_tokens=120, gamma=5,
                           forced_drafts=kind != "model-no-forced")
    assert out.token_ids == plain.token_ids
    assert out.stats.target_calls < plain.stats.target_calls


def test_the_grammar_draft_proposes_forced_tokens_and_they_are_accepted(target):
    """Keys of an object are forced: the grammar draft proposes them (one-hot q) and a token the mask leaves
    alone is accepted with certainty, at any temperature."""
    for temperature in (0.0, 1.0):
        out = specdec.generate(target, "x=", draft="grammar", json_schema=PERSON, temperature=temperature, seed=3,
                               max_new_tokens=200)
        c = out.stats.constraint
        assert c["forced_proposed"] >= len("name") + len("age") + len("role")
        assert c["forced_accepted"] == c["forced_proposed"]  # every forced token was the only one allowed
        plain = specdec.generate(target, "x=", json_schema=PERSON, temperature=temperature, seed=3, max_new_tokens=200)
        assert out.stats.target_calls < plain.stats.target_calls


def test_a_constraint_that_cannot_finish_in_time_ends_at_the_length_and_says_so(target):
    out = specdec.generate(target, "x=", draft="prompt-lookup", json_schema=PERSON, max_new_tokens=5)
    assert out.stats.stop_reason == "max_new_tokens"
    assert out.stats.constraint["complete"] is False
    assert len(out.token_ids) == 5


# -- T = 1: the masked target law -----------------------------------------------------------------------------------
PROMPT = "q"
CELLS = "abcd"
N_RUNS = 1000


def _masked_joint(target):
    """p(x1, x2) for the regex [a-d]{2}: the target's distribution masked to a-d at each position, renormalized."""
    ids = [CHAR_VOCAB.index(c) for c in CELLS]
    prompt = target.encode(PROMPT)
    sampling = SamplingParams(temperature=1.0)
    with torch.inference_mode():
        first = target.hf_model(input_ids=torch.tensor([prompt])).logits[0, -1]
        p1 = standardize(first[ids], sampling)  # [4]
        second = target.hf_model(input_ids=torch.tensor([prompt + [i] for i in ids])).logits[:, -1]
        p2 = standardize(second[:, ids], sampling)  # [4, 4]
    return (p1[:, None] * p2).flatten().numpy()


class HalfRefusedDrafter(DrafterBase):
    """A sampled draft that never sees the constraint: each token is 'a' or 'z' with probability 1/2 (q returned),
    and the grammar [a-d]{2} refuses 'z'. The loop cuts the draft at the first 'z'; a kept 'a' then has q 1 given
    that it was kept, which verification must use (Constraint.admit masks and renormalizes q)."""

    name = "half-refused"

    def propose(self, sequence, k):
        ctx = self.context
        q = torch.zeros(ctx.vocab_size)
        q[CHAR_VOCAB.index("a")] = q[CHAR_VOCAB.index("z")] = 0.5
        picks = torch.rand(k, generator=ctx.generator) < 0.5
        tokens = torch.where(picks, CHAR_VOCAB.index("a"), CHAR_VOCAB.index("z"))
        return Draft(tokens, q.expand(k, -1).clone())


def _counts(target, draft, n_runs):
    counts = [0] * 16
    for seed in range(n_runs):
        out = specdec.generate(target, PROMPT, draft=draft, regex="[a-d]{2}", temperature=1.0, seed=seed, gamma=3)
        a, b = out.text
        counts[CELLS.index(a) * 4 + CELLS.index(b)] += 1
    return counts


@pytest.fixture(scope="module")
def far_draft(target):
    return perturbed(target, 1.5, seed=11)


@pytest.mark.parametrize("kind", ["plain", "masked-model", "cut-sampled", "grammar+prompt-lookup"])
def test_sampled_output_follows_the_masked_target_law(target, far_draft, kind):
    draft = {"plain": None, "masked-model": far_draft, "cut-sampled": HalfRefusedDrafter(),
             "grammar+prompt-lookup": "prompt-lookup"}[kind]
    counts = _counts(target, draft, N_RUNS)
    assert chi_square_pvalue(counts, _masked_joint(target)) > 1e-3


def test_a_draft_cut_at_the_first_refused_token_without_masking_q_is_caught(target, monkeypatch):
    """The planted bug: cut the draft at the first refused token but verify with the unmasked q (what masking the
    target alone does). Exact only for one-hot q; for a sampled draft the test above catches it."""

    def admit_without_masking_q(self, proposal, depth=0):
        ids = proposal.tokens.tolist()
        keep = 0
        while keep < len(ids) and self.push(depth + keep, int(ids[keep])):
            keep += 1
        self._rollback_to(depth + keep)
        return Draft(proposal.tokens[:keep], None if proposal.q is None or not keep else proposal.q[:keep])

    monkeypatch.setattr(Constraint, "admit", admit_without_masking_q)
    counts = _counts(target, HalfRefusedDrafter(), N_RUNS)
    assert chi_square_pvalue(counts, _masked_joint(target)) < 1e-3


# -- rollback -------------------------------------------------------------------------------------------------------
def _rollback_matches_plain(constraint_cls, target) -> bool:
    """Rounds over a known text: each drafts two right tokens, then a wrong one the grammar allows (the target
    rejects it and emits the right one); after settling and committing, the allowed set must be what a matcher
    that only ever saw the emitted tokens allows."""
    grammar = make_grammar(json_schema=PERSON)
    text = specdec.generate(target, "x=", json_schema=PERSON, temperature=1.0, seed=4).token_ids[:-1]  # EOS off
    assert len(text) > 12
    c, ref = constraint_cls(grammar, target, 0), constraint_cls(grammar, target, 0)
    rejections = 0
    try:
        for at in range(0, len(text) - 3, 3):
            right = text[at: at + 3]
            if not (c.push(0, right[0]) and c.push(1, right[1])):
                return False
            wrong = [int(t) for t in c.allowed(2).nonzero().flatten() if int(t) != right[2]][:1]  # none where forced
            drafted = c.admit(Draft(torch.tensor(right[:2] + (wrong or right[2:]))), 0)
            if drafted.tokens.tolist() != right[:2] + (wrong or right[2:]):
                return False
            rejections += bool(wrong)
            c.settle(0, right)  # accepted two, replaced the third
            c.commit()
            for t in right:
                assert ref.push(0, t)
                ref.commit()
            if not torch.equal(c.allowed(0), ref.allowed(0)):
                return False
    except SpecDecError:  # the matcher refused a token it should have taken
        return False
    assert rejections >= 3
    return True


def test_rollback_after_a_rejected_draft_leaves_the_matcher_where_plain_decoding_has_it(target):
    assert _rollback_matches_plain(Constraint, target)

    class NoRollback(Constraint):  # the planted bug: rejected drafts stay consumed
        def _rollback_to(self, depth):
            del self.pushed[depth:]
            del self._host[depth + 1:]
            self._device.clear()

    assert not _rollback_matches_plain(NoRollback, target)


# -- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options, message", [
    (dict(regex="a(b"), "(?s)the regular expression is invalid: .*unclosed group"),
    (dict(json_schema={"type": "bogus"}), "(?s)the JSON schema is invalid: .*bogus"),
    (dict(json_schema="{not json"), "the JSON schema is not valid JSON"),
    (dict(json_schema=[1, 2]), "a JSON schema must be a JSON object"),
    (dict(grammar="start: foo"), "(?s)the grammar is invalid: .*foo"),
    (dict(regex="a", json_schema={}), "give one constraint, not json_schema and regex"),
    (dict(regex=""), "regex must be a non-empty string"),
    (dict(json_schema={}, num_beams=2), "beam search .* does not support a constraint"),
    (dict(regex=["a+"]), "regex must be a string, got list"),
    (dict(grammar=3), "grammar must be a string, got int"),
])
def test_an_invalid_constraint_is_a_clear_error_before_any_model_runs(options, message):
    with pytest.raises(SpecDecError, match=message):
        specdec.GenerationConfig.from_options(**options)
    with pytest.raises(SpecDecError, match=message):  # the target is a name that was never loaded
        specdec.generate("no-such-model", "hi", **options)


def test_a_constraint_the_tokenizer_cannot_express_is_an_error_naming_it(target):
    with pytest.raises(SpecDecError, match="cannot be expressed with tiny-chars-llama's tokenizer"):
        specdec.generate(target, "x", regex="é+")


def test_the_grammar_draft_needs_a_constraint(target):
    with pytest.raises(SpecDecError, match="the 'grammar' draft proposes the tokens a constraint forces"):
        specdec.generate(target, "x", draft="grammar", max_new_tokens=3)


def test_a_dead_end_the_tokenizer_cannot_continue_is_an_error_naming_it(target):
    """'a' is allowed, but nothing this vocabulary has can follow it: plain and speculative decoding both stop
    with the same error (a draft that only explores the dead end leaves the matcher usable)."""
    for draft in (None, "prompt-lookup", "grammar"):
        with pytest.raises(SpecDecError, match="cannot be completed with tiny-chars-llama's tokenizer after 'a'"):
            specdec.generate(target, "a a a a", draft=draft, regex="aé", max_new_tokens=5)
    c = Constraint(make_grammar(regex="aé|bc"), target, 0)
    a, b, cc = (CHAR_VOCAB.index(x) for x in "abc")
    assert c.push(0, a) and not c.allowed(1).any()  # drafted into the dead end: nothing may follow
    assert c.push(0, b) and c.push(1, cc)  # rejected, rolled back: the matcher goes on
    assert c.settle(0, [b, cc]) == 2
    c.commit()
    assert c.complete and not c.dead_end


@pytest.mark.parametrize("draft_kind", ["model", "prompt-lookup", "none"])
def test_constrained_batch_rows_equal_their_generation_alone(target, draft, draft_kind):
    """Rows with different schemas (and one unconstrained) share a batch; each is what generate gives it alone."""
    row_draft = {"model": draft, "none": None}.get(draft_kind, draft_kind)
    prompts = ["x=", "name:", "go ", "a", "{"]
    configs = [specdec.GenerationConfig(json_schema=PERSON, max_new_tokens=120, gamma=4),
               specdec.GenerationConfig(json_schema=NESTED, max_new_tokens=120, gamma=3),
               specdec.GenerationConfig(json_schema=ENUM_ONLY, max_new_tokens=40),
               specdec.GenerationConfig(regex="[a-c]{3,6}!", max_new_tokens=40, gamma=2),
               specdec.GenerationConfig(max_new_tokens=15)]
    alone = [specdec.generate(target, p, draft=row_draft, config=c) for p, c in zip(prompts, configs)]
    outs = specdec.generate_batch(target, prompts, draft=row_draft, configs=configs)
    for out, ref, config in zip(outs, alone, configs):
        assert out.token_ids == ref.token_ids
        assert out.stats.stop_reason == ref.stats.stop_reason
        if config.json_schema is not None:
            jsonschema.validate(json.loads(out.text), json.loads(config.json_schema))
    if draft_kind == "prompt-lookup":  # the grammar's forced tokens drafted for the rows
        assert outs[0].stats.constraint["forced_accepted"] > 0


def test_the_static_engine_under_a_constraint_equals_the_dynamic_one(target, draft):
    """The static, position-indexed engine (the CUDA default; here on CPU) masks the same logits: same tokens."""
    static = specdec.load(target.hf_model, tokenizer=target.tokenizer, name="tiny-chars-static", engine="static")
    static_draft = specdec.load(draft.hf_model, tokenizer=draft.tokenizer, name="tiny-chars-draft-static",
                                engine="static")
    for schema in (PERSON, NESTED):
        ref = specdec.generate(target, "x=", draft=draft, json_schema=schema, max_new_tokens=120)
        out = specdec.generate(static, "x=", draft=static_draft, json_schema=schema, max_new_tokens=120)
        assert out.token_ids == ref.token_ids


def test_a_stop_string_inside_the_constrained_output_leaves_it_incomplete(target):
    out = specdec.generate(target, "x=", json_schema=PERSON, stop=['"age'], max_new_tokens=200)
    assert out.stats.stop_reason == "stop" and '"age' not in out.text
    assert out.stats.constraint["complete"] is False


def test_a_complete_grammar_without_an_end_token_ends_the_generation_and_keeps_the_origins_aligned():
    """A model without EOS: once the regex is matched nothing may follow, the target's token is refused and the
    generation ends ('constraint'); each round's tokens and their origins stay the same length."""
    model = load_tiny_chars(sharp=3.0, eos=None)
    events = []
    out = specdec.generate(model, "id:", draft="grammar", regex="[a-c]{4}", max_new_tokens=20, on_round=events.append)
    assert out.stats.stop_reason == "constraint" and len(out.token_ids) == 4 and out.stats.constraint["complete"]
    assert all(len(e.tokens) == len(e.from_draft) for e in events)
    assert sum(len(e.tokens) for e in events) == 4


def test_a_failed_start_gives_the_caches_back(target):
    static = specdec.load(target.hf_model, tokenizer=target.tokenizer, name="tiny-chars-pool", engine="static")
    with pytest.raises(SpecDecError, match="cannot be expressed"):
        specdec.generate(static, "x", regex="é+")
    assert static._caches and not any(in_use for _, in_use in static._caches)


def test_a_batch_row_with_the_grammar_draft_and_no_constraint_is_refused_before_it_joins(target):
    from specdec.batch.engine import BatchEngine

    engine = BatchEngine(target, None, max_batch=2)
    with pytest.raises(SpecDecError, match="the 'grammar' draft proposes the tokens a constraint forces"):
        engine.add(target.encode("x"), specdec.GenerationConfig(max_new_tokens=3), draft="grammar")
    assert not engine.busy
