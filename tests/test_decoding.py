"""The decoding loop on tiny random models: greedy exactness, rollback, seeds, stops, statistics."""

import pytest
import torch

import specdec
from specdec.models.sessions.session import DynamicSession
from specdec.text import IncrementalDecoder
from tiny import load_tiny, perturbed, tiny_gemma3

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]
N_NEW = 40


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3"])
def target(request):
    if request.param == "gemma3":
        return tiny_gemma3(eos=None)
    return load_tiny(request.param, eos=None)


def plain_greedy(model, prompt=PROMPT, n=N_NEW):
    return specdec.generate(model, prompt, max_new_tokens=n, temperature=0)


def drafts_for(target):
    return {
        "good (perturbed copy)": perturbed(target, 0.05),
        "poor (heavily perturbed)": perturbed(target, 1.0, seed=7),
        "target as its own draft": target,
        "random": "random",
        "prompt-lookup": "prompt-lookup",
        "suffix": "suffix",
        "bigram": "bigram",
    }


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_speculative_equals_plain_greedy(target, gamma):
    plain = plain_greedy(target)
    assert len(plain.token_ids) == N_NEW
    for name, draft in drafts_for(target).items():
        out = specdec.generate(target, PROMPT, draft=draft, gamma=gamma, max_new_tokens=N_NEW, temperature=0)
        assert out.token_ids == plain.token_ids, f"{name}, gamma={gamma}"
        assert out.stats.target_calls <= plain.stats.target_calls


def test_plain_greedy_equals_transformers_generate(target):
    plain = plain_greedy(target)
    hf = target.hf_model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                                  pad_token_id=3)
    assert hf[0, len(PROMPT):].tolist() == plain.token_ids


def test_the_first_token_comes_from_the_prefill_as_in_transformers(target):
    """The prefill covers the whole prompt and its last position gives the first token: plain decoding of n
    tokens runs n forward passes of the target (the prefill and n - 1 steps), as transformers' generate does;
    a speculative first round's pass covers its drafts only."""
    draft = perturbed(target, 0.05)  # (before the hook: a copy would inherit it)
    passes = []
    hook = target.hf_model.register_forward_pre_hook(lambda module, args: passes.append(1))
    try:
        plain = plain_greedy(target, n=12)
        hf_passes = len(passes)
        passes.clear()
        target.hf_model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=12, min_new_tokens=12,
                                 pad_token_id=3)
        assert len(passes) == hf_passes == 12 == plain.stats.target_calls
        passes.clear()
        spec = specdec.generate(target, PROMPT, draft=draft, gamma=3, max_new_tokens=12, temperature=0)
        assert spec.token_ids == plain.token_ids
        assert len(passes) == 1 + spec.stats.target_calls  # the prefill, then one pass per round
    finally:
        hook.remove()


def test_target_as_its_own_draft_accepts_everything(target):
    out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=N_NEW - 5)  # 35 = 7 steps of 5
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.alpha == 1.0
    assert out.stats.mean_accepted_length == 5.0
    assert all(out.from_draft[i] == (i % 5 != 4) for i in range(len(out.token_ids)))


def test_rollback_gives_the_logits_of_a_fresh_forward(target):
    torch.manual_seed(0)
    session = DynamicSession(target)
    base = PROMPT + [20, 21, 22]
    session.logits_of(base + [30, 31, 32, 33], 5)  # speculative tail, then rejected
    session.logits_of(base + [40], 2)  # rollback of 4 tokens, one new token
    session.logits_of(base + [40, 41, 42], 1)
    logits = session.logits_of(base + [40, 41, 50, 51], 3)  # rollback of 1
    with torch.inference_mode():
        fresh = target.hf_model(input_ids=torch.tensor([base + [40, 41, 50, 51]])).logits[0, -3:]
    torch.testing.assert_close(logits, fresh, rtol=1e-4, atol=1e-4)
    assert session.tokens == base + [40, 41, 50, 51]


def test_rollback_across_the_sliding_window():
    model = tiny_gemma3(sliding_window=4)
    session = DynamicSession(model)
    seq = PROMPT + [20, 21, 22, 23, 24, 25]  # longer than the window
    session.logits_of(seq, 1)
    session.logits_of(seq + [30, 31, 32], 3)
    session.logits_of(seq + [30, 33, 34], 2)  # rollback of 2 beyond the window start
    logits = session.logits_of(seq + [30, 33, 34, 35], 1)
    with torch.inference_mode():
        fresh = model.hf_model(input_ids=torch.tensor([seq + [30, 33, 34, 35]])).logits[0, -1:]
    torch.testing.assert_close(logits, fresh, rtol=1e-4, atol=1e-4)


def test_same_seed_same_output_and_seeds_differ():
    target = load_tiny()
    draft = perturbed(target, 0.3)
    runs = [specdec.generate(target, PROMPT, draft=draft, gamma=3, max_new_tokens=30, temperature=1.0, seed=s).token_ids
            for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_temperature_zero_ignores_the_seed():
    target = load_tiny()
    draft = perturbed(target, 0.3)
    outs = {tuple(specdec.generate(target, PROMPT, draft=draft, max_new_tokens=20, seed=s).token_ids) for s in range(4)}
    assert len(outs) == 1


def test_max_new_tokens_is_exact_with_speculation():
    target = load_tiny()
    for n in (1, 2, 3, 7):
        out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=n)
        assert len(out.token_ids) == n and out.stats.stop_reason == "max_new_tokens"


def test_eos_ends_generation_and_is_kept():
    plain = plain_greedy(load_tiny())
    eos = plain.token_ids[5]
    first = plain.token_ids.index(eos)
    target = load_tiny(eos=eos)
    for draft in (None, target, "prompt-lookup"):
        out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=N_NEW)
        assert out.token_ids == plain.token_ids[: first + 1]
        assert out.stats.stop_reason == "eos"


def test_stop_string_cuts_text():
    target = load_tiny()
    plain = plain_greedy(target)
    words = plain.text.split()
    stop = words[6]
    out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=N_NEW, stop=[stop])
    assert out.stats.stop_reason == "stop"
    assert stop not in out.text
    assert plain.text.startswith(out.text)
    assert out.text.split() == words[: words.index(stop)]
    assert target.decode(out.token_ids).endswith(stop)  # tokens end with the one that completed the stop


def test_streaming_callback_sees_every_token_with_its_origin():
    target = load_tiny()
    seen, origins = [], []
    out = specdec.generate(target, PROMPT, draft=perturbed(target, 0.3), gamma=4, max_new_tokens=25,
                           on_tokens=lambda toks, fd: (seen.extend(toks), origins.extend(fd)))
    assert seen == out.token_ids and origins == out.from_draft
    assert sum(origins) == out.stats.accepted
    assert out.stats.target_calls == len(origins) - sum(origins)  # one target token per step


def test_round_callback_reports_the_drafts_and_what_the_target_kept():
    target = load_tiny()
    plain = plain_greedy(target)
    events = []
    out = specdec.generate(target, PROMPT, draft=perturbed(target, 0.5), gamma=4, max_new_tokens=N_NEW,
                           on_round=events.append)
    assert out.token_ids == plain.token_ids
    assert len(events) == out.stats.target_calls and [t for e in events for t in e.tokens] == out.token_ids
    assert [f for e in events for f in e.from_draft] == out.from_draft
    assert sum(len(e.drafted) for e in events) == out.stats.drafted
    assert sum(e.accepted for e in events) == out.stats.accepted
    position = 0
    for e in events:
        assert e.drafted[: e.accepted] == e.tokens[: e.accepted]  # accepted drafts are the text
        assert e.from_draft == [True] * e.accepted + [False] * (len(e.tokens) - e.accepted)
        if e.rejected:  # greedy: the first rejected draft token is not the target's token there
            assert e.rejected[0] != out.token_ids[position + e.accepted]
        position += len(e.tokens)
    assert any(e.rejected for e in events) and any(len(e.rejected) < len(e.drafted) for e in events)


def test_statistics_are_consistent():
    target = load_tiny()
    out = specdec.generate(target, PROMPT, draft=perturbed(target, 0.5), gamma=4, max_new_tokens=N_NEW)
    s = out.stats
    assert s.new_tokens == N_NEW == s.accepted + s.target_calls
    assert s.mean_accepted_length == pytest.approx(N_NEW / s.target_calls)
    assert sum(s.accepted_per_position) == s.accepted and sum(s.drafted_per_position) == s.drafted
    assert s.draft_calls >= s.drafted - s.target_calls  # at least one forward per drafted token after the first step
    assert 0.0 <= s.alpha <= 1.0
    assert s.time_total >= s.time_draft + s.time_target
    d = s.to_dict()
    assert d["mean_accepted_length"] == s.mean_accepted_length and d["alpha"] == s.alpha


def test_the_prefills_are_timed_apart(monkeypatch):
    """The target's prefill is time_prefill (not the rounds' target time, not "other"); the draft's prefill is its
    start, part of time_draft: a prefill made to take a second lands in its own field."""
    import time

    target = load_tiny()
    slow = 1.0
    prefill = DynamicSession.prefill

    def slow_prefill(self, ids):
        time.sleep(slow)
        return prefill(self, ids)

    monkeypatch.setattr(DynamicSession, "prefill", slow_prefill)
    s = specdec.generate(target, PROMPT, draft=perturbed(target, 0.5), gamma=4, max_new_tokens=N_NEW).stats
    assert s.time_prefill >= slow and s.time_draft_start >= slow and s.time_draft >= s.time_draft_start
    assert s.time_target < slow and s.time_other < slow  # (each sleep counted once, where it happened)
    assert s.time_total >= s.time_prefill + s.time_draft + s.time_target
    assert f"time: prefill {s.time_prefill:.2f} s" in s.summary() and "its start" in s.summary()
    d = s.to_dict()
    assert d["time_prefill_s"] == s.time_prefill and d["time_draft_start_s"] == s.time_draft_start


def _tokens_through(model, ids, stop):
    """The shortest prefix of ``ids`` whose text contains ``stop``."""
    return next(ids[:i] for i in range(1, len(ids) + 1) if stop in model.decode(ids[:i]))


def test_stop_string_that_spans_tokens():
    target = load_tiny()
    plain = plain_greedy(target)
    words = plain.text.split()
    stop = words[6][-1] + " " + words[7][:2]  # the end of one token, the space, the start of the next
    cut = plain.text.find(stop)
    assert cut > 0
    for draft in (None, target, "prompt-lookup"):
        out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=N_NEW, stop=[stop])
        assert out.stats.stop_reason == "stop"
        assert out.text == plain.text[:cut]
        assert out.token_ids == _tokens_through(target, plain.token_ids, stop)


def test_several_stop_strings_cut_at_the_first_in_the_text():
    target = load_tiny()
    plain = plain_greedy(target)
    words = plain.text.split()
    early, late = words[4] + " " + words[5], words[9]
    assert plain.text.find(early) < plain.text.find(late)
    for stops in ([late, early], [early, late], ["never there", late, early]):
        out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=N_NEW, stop=stops)
        assert out.text == plain.text[: plain.text.find(early)], stops
        assert out.token_ids == _tokens_through(target, plain.token_ids, early)
    out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=N_NEW, stop=[late, "never there"])
    assert out.text == plain.text[: plain.text.find(late)]


def test_a_stop_string_that_never_appears_changes_nothing():
    target = load_tiny()
    plain = plain_greedy(target)
    out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=N_NEW, stop=["w1000", "x"])
    assert out.token_ids == plain.token_ids and out.text == plain.text
    assert out.stats.stop_reason == "max_new_tokens"


def test_stop_checks_decode_only_the_new_tokens():
    """A round decodes a short window of recent tokens, never the whole text: the only full decodes are
    the final text's and, when a stop string appears, its confirmation."""
    target = load_tiny()
    lengths = []
    real_decode = target.decode

    def counting_decode(ids):
        lengths.append(len(ids))
        return real_decode(ids)

    target.decode = counting_decode
    try:
        out = specdec.generate(target, PROMPT, draft=target, gamma=4, max_new_tokens=200, stop=["never there"])
    finally:
        del target.decode
    assert len(out.token_ids) == 200
    rounds = out.stats.target_calls
    assert max(lengths[:-1]) <= IncrementalDecoder(None).window + 2 * 5 and lengths[-1] == 200  # windows; the final text
    assert len(lengths) <= rounds + rounds // 2 + 2  # one decode a round, one more every other round (restarts)


def _groups(target, draft, **options):
    groups = []
    out = specdec.generate(target, PROMPT, draft=draft, gamma=4, max_new_tokens=N_NEW,
                           on_tokens=lambda toks, fd: groups.append((list(toks), list(fd))), **options)
    return out, groups


def test_streaming_when_eos_cuts_a_round():
    plain = plain_greedy(load_tiny())
    index = next(i for i in range(6, N_NEW) if plain.token_ids[i] not in plain.token_ids[:i] and i % 5 not in (0, 4))
    target = load_tiny(eos=plain.token_ids[index])  # EOS in the middle of the target drafting for itself
    out, groups = _groups(target, target)
    assert out.token_ids == plain.token_ids[: index + 1] and out.stats.stop_reason == "eos"
    assert [t for g, _ in groups for t in g] == out.token_ids  # EOS included, nothing after it
    assert [f for _, fs in groups for f in fs] == out.from_draft
    assert [len(g) for g, _ in groups] == [5] * (index // 5) + [index % 5 + 1]  # the last round was cut


def test_streaming_when_a_stop_string_cuts_a_round():
    target = load_tiny()
    plain = plain_greedy(target)
    words = plain.text.split()
    stop = words[7]
    assert words.index(stop) == 7  # plain decoding: one word per token here
    out, groups = _groups(target, target, stop=[stop])
    assert out.token_ids == plain.token_ids[:8] and out.stats.stop_reason == "stop"
    assert [t for g, _ in groups for t in g] == out.token_ids  # through the stop's last token, nothing after
    assert [f for _, fs in groups for f in fs] == out.from_draft == [True] * 4 + [False] + [True] * 3
    assert [len(g) for g, _ in groups] == [5, 3]


def test_seed_replay_through_the_api():
    """A run without a seed reports the seed it drew; running again with it gives the same tokens."""
    target = load_tiny()
    draft = perturbed(target, 0.3)
    for options in ({"draft": draft, "gamma": 3}, {"draft": None}, {"draft": "random", "gamma": 2}):
        first = specdec.generate(target, PROMPT, max_new_tokens=30, temperature=1.0, **options)
        assert first.config.seed is None and isinstance(first.stats.seed, int)
        again = specdec.generate(target, PROMPT, max_new_tokens=30, temperature=1.0, seed=first.stats.seed, **options)
        assert again.token_ids == first.token_ids and again.from_draft == first.from_draft
        other = specdec.generate(target, PROMPT, max_new_tokens=30, temperature=1.0, seed=first.stats.seed + 1, **options)
        assert other.token_ids != first.token_ids


def test_plain_greedy_ending_at_eos_equals_transformers_generate():
    """Full lengths compared: both stop at the same end-of-sequence token, and keep it."""
    plain = plain_greedy(load_tiny())
    eos = plain.token_ids[6]
    target = load_tiny(eos=eos)
    out = plain_greedy(target)
    hf = target.hf_model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=N_NEW, pad_token_id=3)
    assert out.token_ids == hf[0, len(PROMPT):].tolist() == plain.token_ids[: plain.token_ids.index(eos) + 1]
    assert out.stats.stop_reason == "eos" and len(out.token_ids) < N_NEW
