"""Parameter-free drafters, table-driven from their docstring examples, and the drafter protocol."""

import random

import pytest
import torch

import specdec
from specdec.drafters import (DraftContext, Drafter, NGramDrafter, PromptLookupDrafter, RandomDrafter, SuffixDrafter,
                              find_continuation, make_drafter, suffix_continuation)
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams
from tiny import load_tiny


@pytest.mark.parametrize(
    "context, k, max_ngram, expected",
    [
        ([1, 2, 3, 4, 1, 2], 2, 3, [3, 4]),
        ([5, 6, 7, 5, 6, 8, 5, 6], 3, 3, [8, 5, 6]),  # the most recent match wins
        ([1, 2, 3], 2, 3, []),  # nothing repeats
        ([1, 2, 3, 9, 2, 3], 5, 3, [9, 2, 3]),  # a 2-gram match; fewer than k tokens follow
        ([4, 1, 2, 3, 7, 7, 2, 3], 2, 3, [7, 7]),  # "2 3" seen at positions 2-3
        ([4, 1, 2, 3, 7, 7, 2, 3], 2, 1, [7, 7]),  # max_ngram 1: only "3" is matched (at index 3)
        ([9, 3, 5, 1, 2, 3], 2, 1, [5, 1]),  # unigram match on the most recent earlier "3"
        ([1, 1, 1, 1], 3, 3, [1]),  # the 3-gram [1 1 1] occurs at 0..2, followed by one token
        ([1, 2, 1, 2, 1, 2], 0, 3, []),  # k = 0
    ],
)
def test_find_continuation(context, k, max_ngram, expected):
    assert find_continuation(context, k, max_ngram=max_ngram) == expected


def _ctx(prompt, temperature=0.0, vocab=16):
    return DraftContext(prompt, SamplingParams(temperature=temperature), torch.Generator().manual_seed(0), vocab)


def test_prompt_lookup_drafter_proposes_without_probabilities():
    d = PromptLookupDrafter()
    d.start(_ctx([1, 2, 3, 4, 1, 2]))
    draft = d.propose([1, 2, 3, 4, 1, 2], 4)
    assert draft.tokens.tolist() == [3, 4, 1, 2] and draft.q is None


@pytest.mark.parametrize(
    "context, k, options, expected",
    [
        ([1, 2, 3, 4, 9, 1, 2, 3], 3, {}, [4, 9, 1]),  # the longest match, [1, 2, 3], continued
        ([5, 1, 7, 5, 1, 7, 8, 1], 4, {}, [7, 8]),  # only [1] matches (so 2 tokens at most): both say 7, then
        # 5 or 8, a tie: the later, 8
        ([4, 1, 2, 4, 1, 3, 9, 4, 1], 2, {}, [3, 9]),  # [4, 1] went on with 2 and with 3: a tie, the later wins
        ([4, 1, 2, 4, 1, 2, 4, 1, 3, 4, 1], 2, {}, [2, 4]),  # 2 twice, 3 once: the most frequent wins over the latest
        ([4, 1, 2, 4, 1, 3, 9, 4, 1], 2, {"min_probability": 0.6}, []),  # the tie leaves probability 1/2: nothing
        ([1, 2, 3, 4, 5, 6, 0, 1, 2, 3], 8, {"spec_factor": 1.0}, [4, 5, 6]),  # at most 1 x the 3-token match
        ([1, 2, 3, 4, 5, 6, 0, 1, 2, 3], 8, {"max_depth": 1}, [4, 5]),  # a 1-token match, spec_factor 2
        ([1, 2, 3], 4, {}, []),  # nothing repeats
        ([3, 3], 4, {}, [3]),  # the occurrence's continuation is the last token; nothing after it
        ([1, 2, 1], 0, {}, []),
    ],
)
def test_suffix_continuation(context, k, options, expected):
    assert suffix_continuation(context, k, **options) == expected


def _suffix_reference(context, k, max_depth=32, min_probability=0.1, spec_factor=2.0):
    """The suffix draft written out with loops: every earlier occurrence of the longest repeated suffix, walked
    forward by majority (ties: the occurrence that ends latest)."""
    n = len(context)
    depth, ends = 0, []
    for d in range(1, min(max_depth, n - 1) + 1):
        found = [e for e in range(d - 1, n - 1) if context[e - d + 1: e + 1] == context[n - d:]]
        if not found:
            break
        depth, ends = d, found
    if not depth or k <= 0:
        return []
    out, probability, cursors = [], 1.0, [e + 1 for e in ends]
    while len(out) < min(k, int(spec_factor * depth)):
        cursors = [c for c in cursors if c < n]
        if not cursors:
            break
        counts = {}
        for c in cursors:
            counts.setdefault(context[c], []).append(c)
        token = max(counts, key=lambda t: (len(counts[t]), max(counts[t])))
        probability *= len(counts[token]) / len(cursors)
        if probability < min_probability:
            break
        out.append(token)
        cursors = [c + 1 for c in counts[token]]
    return out


def test_suffix_continuation_equals_the_loop_reference_on_random_sequences():
    rng = random.Random(0)
    checked = proposed = 0
    for _ in range(400):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 60))]
        for options in ({}, {"min_probability": 0.4}, {"spec_factor": 1.0, "max_depth": 3}):
            expected = _suffix_reference(context, 6, **options)
            assert suffix_continuation(context, 6, **options) == expected, (context, options)
            checked, proposed = checked + 1, proposed + bool(expected)
    assert proposed > checked // 2  # the cases exercise proposals, not only empty answers


def test_suffix_drafter_proposes_without_probabilities_and_checks_its_settings():
    d = SuffixDrafter()
    d.start(_ctx([1, 2, 3, 4, 1, 2]))
    draft = d.propose([1, 2, 3, 4, 1, 2], 4)
    assert draft.tokens.tolist() == [3, 4, 1, 2] and draft.q is None
    with pytest.raises(SpecDecError, match="min_probability"):
        SuffixDrafter(min_probability=2.0)


def test_bigram_counts_and_greedy_proposal():
    d = NGramDrafter(order=2, corpus_ids=[7, 8, 7, 8, 7, 9])
    assert d.counts_after(7) == {8: 2, 9: 1}
    d.start(_ctx([7]))
    draft = d.propose([3, 7], 3)  # 7 -> 8 (2 of 3), 8 -> 7, 7 -> 8
    assert draft.tokens.tolist() == [8, 7, 8]
    assert draft.q.shape == (3, 16) and draft.q[0].tolist()[8] == 1.0  # greedy q is one-hot


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_table_drafts_never_read_the_device(temperature):
    """n-gram tables and prompt lookup compute on the host and hand the device one proposal: on the
    meta device (tensors without values, where any read fails) their proposals still come out whole."""
    meta = DraftContext([7, 8, 7, 8, 7, 9], SamplingParams(temperature=temperature), torch.Generator().manual_seed(0),
                        16, device=torch.device("meta"))
    for drafter in (NGramDrafter(order=2), NGramDrafter(order=1), PromptLookupDrafter()):
        drafter.start(meta)
        draft = drafter.propose([7, 8, 7, 8, 7, 9, 7, 8], 3)
        assert draft.tokens.device.type == "meta" and draft.tokens.shape == (3,), drafter.name
        assert draft.q is None if isinstance(drafter, PromptLookupDrafter) else draft.q.shape == (3, 16)


def test_a_gpu_generation_gives_host_drafters_a_cpu_generator_seeded_from_its_own():
    from types import SimpleNamespace

    cpu = torch.Generator().manual_seed(5)
    assert DraftContext([1], SamplingParams(), cpu, 8).host_generator is cpu  # on CPU: the generation's own
    # a CUDA generator as DraftContext sees one (where CI runs there is no CUDA to make a real one)
    cuda = SimpleNamespace(device=torch.device("cuda"), initial_seed=lambda: 5)
    context = DraftContext([1], SamplingParams(), cuda, 8, device=torch.device("cuda"))
    host = context.host_generator
    assert host.device.type == "cpu" and host.initial_seed() == 5
    assert context.host_generator is host  # one stream of draws for the whole generation, not a restart per call
    first = torch.rand(3, generator=host)
    assert not torch.equal(torch.rand(3, generator=context.host_generator), first)


def test_bigram_q_is_the_normalised_counts_at_temperature_one():
    d = NGramDrafter(order=2, corpus_ids=[7, 8, 7, 8, 7, 9])
    d.start(_ctx([7], temperature=1.0))
    q = d.propose([7], 1).q[0]
    torch.testing.assert_close(q[[8, 9]], torch.tensor([2 / 3, 1 / 3]))
    assert q.sum().item() == pytest.approx(1.0)


def test_bigram_backs_off_to_unigram_for_unseen_tokens():
    d = NGramDrafter(order=2, corpus_ids=[1, 2, 2, 2, 3])
    d.start(_ctx([1], temperature=1.0))
    q = d.propose([9], 1).q[0]  # 9 never seen: unigram counts 1:1, 2:3, 3:1
    torch.testing.assert_close(q[[1, 2, 3]], torch.tensor([0.2, 0.6, 0.2]))


def test_unigram_from_the_prompt_learns_generated_tokens():
    d = NGramDrafter(order=1)
    d.start(_ctx([5, 5, 6]))
    assert d.propose([5, 5, 6], 1).tokens.tolist() == [5]
    # after the sequence grows with many 6s, 6 becomes the most frequent token
    assert d.propose([5, 5, 6, 6, 6, 6], 1).tokens.tolist() == [6]


def test_random_drafter_is_uniform_over_real_tokens():
    d = RandomDrafter(n_tokens=10)
    d.start(_ctx([1], temperature=1.0))
    draft = d.propose([1], 2000)
    assert draft.tokens.max() < 10
    torch.testing.assert_close(draft.q[0, :10], torch.full((10,), 0.1))
    assert draft.q[0, 10:].sum() == 0
    counts = torch.bincount(draft.tokens, minlength=10).float()
    assert counts.min() > 140 and counts.max() < 260  # 200 expected each; 4.5 standard deviations


def test_make_drafter_names_and_protocol():
    target = load_tiny()
    assert make_drafter(None, target) is None
    assert isinstance(make_drafter("prompt-lookup", target), PromptLookupDrafter)
    assert isinstance(make_drafter("suffix", target), SuffixDrafter)
    assert make_drafter("bigram", target).order == 2 and make_drafter("unigram", target).order == 1
    assert isinstance(make_drafter("random", target), RandomDrafter)
    assert make_drafter(target, target).model is target
    for name in ("prompt-lookup", "bigram", "random"):
        assert isinstance(make_drafter(name, target), Drafter)


def test_custom_drafter_plugs_in():
    class Echo:
        """Always proposes the last token again, without probabilities."""

        name, forward_passes = "echo", 0

        def start(self, context):
            self.feedback = []

        def propose(self, sequence, k):
            return specdec.drafters.Draft(torch.tensor([sequence[-1]] * k), None)

        def update(self, n_accepted):
            self.feedback.append(n_accepted)

    target = load_tiny()
    echo = Echo()
    plain = specdec.generate(target, [1, 10, 11], max_new_tokens=20)
    out = specdec.generate(target, [1, 10, 11], draft=echo, gamma=3, max_new_tokens=20)
    assert out.token_ids == plain.token_ids
    assert len(echo.feedback) == out.stats.target_calls and sum(echo.feedback) == out.stats.accepted


# -- the protocol's close(): every level's caches go back to their pools -----------------------------

POOL_KINDS = ["model", "hierarchy", "retokenized", "hierarchy-retokenized", "prompt-lookup"]


@pytest.fixture(scope="module")
def pool_models():
    from test_retokenized import byte_bpe, tiny_draft
    from tiny import perturbed

    def static(model):
        return specdec.load(model.hf_model, tokenizer=model.tokenizer, name=f"{model.name}-static", engine="static")

    base = load_tiny(eos=None)
    return {"target": static(base), "m1": static(perturbed(base, 0.1)), "m2": static(perturbed(base, 0.3, seed=4)),
            "other": static(tiny_draft(byte_bpe()))}


def _caches_in_use(models) -> int:
    return sum(used for model in models for _, used in model._caches)


@pytest.mark.parametrize("ending", ["success", "error", "cancel"])
@pytest.mark.parametrize("kind", POOL_KINDS)
def test_closing_a_generation_gives_every_cache_back(pool_models, kind, ending):
    from specdec.serve.worker import Cancelled

    m = pool_models
    draft = {"model": m["m1"], "hierarchy": [m["m1"], m["m2"], "prompt-lookup"], "retokenized": m["other"],
             "hierarchy-retokenized": [m["m1"], m["other"]], "prompt-lookup": "prompt-lookup"}[kind]
    models = [m["target"], *[d for d in (draft if isinstance(draft, list) else [draft]) if not isinstance(d, str)]]
    held = []

    def on_tokens(ids, from_draft):
        held.append(_caches_in_use(models))  # one cache per model while the generation runs
        if ending == "error" and len(held) == 3:
            raise RuntimeError("the callback failed")
        if ending == "cancel" and len(held) == 2:
            raise Cancelled("disconnected")  # what the server raises when a client leaves

    def run():
        return specdec.generate(m["target"], "w1 w2 w3", draft=draft, gamma=3, max_new_tokens=12, on_tokens=on_tokens)

    caught = None
    if ending == "success":
        assert len(run().token_ids) == 12
    else:
        with pytest.raises(RuntimeError if ending == "error" else Cancelled) as caught:
            run()
    assert held and held[0] == len(models)
    # every level's cache is back in its pool, free for the next generation, though the exception (its
    # traceback, its frames, the drafter) is still alive, as in the server's worker; not left to __del__
    assert _caches_in_use(models) == 0 and (caught is None or caught.value is not None)
    kept = {model.name: len(model._caches) for model in models}
    run_again = specdec.generate(m["target"], "w1 w2 w3", draft=draft, gamma=3, max_new_tokens=4)
    assert len(run_again.token_ids) == 4 and {model.name: len(model._caches) for model in models} == kept  # reused


def test_a_drafter_with_the_three_core_methods_gets_the_rest():
    from specdec.drafters.base import Completed

    class Bare:  # the protocol of earlier releases
        name = "bare"

        def start(self, context): ...
        def propose(self, sequence, k): ...
        def update(self, n): ...

    bare = make_drafter(Bare(), load_tiny())
    assert isinstance(bare, Completed) and isinstance(bare, Drafter) and bare.name == "bare"
    assert (bare.forward_passes, bare.step_widths(4), bare.stats().levels, bare.close()) == (0, {}, [], None)


def test_your_own_drafter_from_the_readme():
    from specdec.drafters import Draft, DrafterBase

    class RepeatLast(DrafterBase):
        """Proposes the last token again, k times (a one-hot q: the target accepts x with probability p(x))."""

        name = "repeat-last"

        def propose(self, sequence, k):
            return Draft.from_ids([sequence[-1]] * k, self.context.device)

    target = load_tiny()
    out = specdec.generate(target, "w1 w2 w3", draft=RepeatLast(), gamma=3, max_new_tokens=10)
    assert out.token_ids == specdec.generate(target, "w1 w2 w3", max_new_tokens=10).token_ids
    assert out.stats.drafted > 0 and out.stats.levels == [] and RepeatLast().step_widths(3) == {}
