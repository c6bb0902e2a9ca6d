"""Beam search: plain == transformers, exact speculative (paper A.4) == plain, the report's variant, errors."""

import math

import pytest
import torch

import specdec
from specdec.beam import beam_search
from specdec.drafters import DraftContext, NGramDrafter
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams
from tiny import load_tiny, perturbed, tiny_seq2seq

PROMPT = [1, 10, 11, 12, 13, 14, 10, 11]
N_NEW = 16


def same_score(score, hf_score):
    """The beam score is a float32 sum of log-probabilities divided by length ** length_penalty, so its
    rounding grows with its size (at length_penalty -1 it is the sum times the length, about -100 to
    -200 here, where one float32 ulp is 8e-6 to 1.5e-5): a relative tolerance of 1e-6 (a few ulps), and
    1e-6 absolute near zero. A CI run saw identical tokens with scores 2 ulps apart
    (-114.775459 vs -114.775475), which an absolute 1e-6 rejected."""
    return score == pytest.approx(hf_score, rel=1e-6, abs=1e-6)


def hf_beam(model, prompt, w, n, length_penalty=1.0, early_stopping=False):
    with torch.inference_mode():
        out = model.hf_model.generate(
            torch.tensor([prompt]), num_beams=w, do_sample=False, max_new_tokens=n, length_penalty=length_penalty,
            early_stopping=early_stopping, pad_token_id=model.tokenizer.pad_token_id or 0,
            return_dict_in_generate=True, output_scores=True,
        )
    return out.sequences[0, len(prompt):].tolist(), float(out.sequences_scores[0])


def with_eos_in_play(kind, seed, position):
    """A tiny model whose EOS is a token its beam search does produce: the token at ``position`` of its
    EOS-free beam output. Hypotheses then finish at different lengths."""
    base = load_tiny(kind, eos=None, seed=seed, sharp=4.0)
    eos = beam_search(base, PROMPT, num_beams=3, max_new_tokens=N_NEW).token_ids[position]
    return load_tiny(kind, eos=eos, seed=seed, sharp=4.0)


MODELS = {  # (kind, seed, position) chosen so that EOS ends some of the w in {2, 3, 5} outputs, not all
    "llama": ("llama", 3, 5),
    "qwen2": ("qwen2", 0, 8),
}


@pytest.fixture(scope="module", params=list(MODELS))
def kind(request):
    return request.param


@pytest.fixture(scope="module")
def eos_target(kind):
    return with_eos_in_play(*MODELS[kind])


@pytest.fixture(scope="module")
def plain_target(kind):
    kind, seed, _ = MODELS[kind]
    return load_tiny(kind, eos=None, seed=seed, sharp=4.0)


# -- plain beam search equals transformers ---------------------------------------------------------


@pytest.mark.parametrize("length_penalty", [1.0, 2.0])
@pytest.mark.parametrize("w", [2, 3, 5])
def test_plain_beam_search_equals_transformers(plain_target, eos_target, w, length_penalty):
    for target in (plain_target, eos_target):
        hf_tokens, hf_score = hf_beam(target, PROMPT, w, N_NEW, length_penalty)
        out = beam_search(target, PROMPT, num_beams=w, max_new_tokens=N_NEW, length_penalty=length_penalty)
        assert out.token_ids == hf_tokens
        assert same_score(out.score, hf_score)
        assert out.stats["target_calls"] == out.stats["steps"]  # prefill + one batched pass per later step
        assert out.stats["mode"] == "plain" and out.stats["exact"] is True


def test_eos_is_in_play(eos_target):
    stops = {w: beam_search(eos_target, PROMPT, num_beams=w, max_new_tokens=N_NEW).stats["stop_reason"]
             for w in (2, 3, 5)}
    assert "eos" in stops.values() and "max_new_tokens" in stops.values(), stops


@pytest.mark.parametrize("early_stopping", [True, "never"])
@pytest.mark.parametrize("length_penalty", [0.5, -1.0])
def test_plain_beam_search_early_stopping_equals_transformers(eos_target, early_stopping, length_penalty):
    hf_tokens, hf_score = hf_beam(eos_target, PROMPT, 3, N_NEW, length_penalty, early_stopping)
    out = beam_search(eos_target, PROMPT, num_beams=3, max_new_tokens=N_NEW, length_penalty=length_penalty,
                      early_stopping=early_stopping)
    assert out.token_ids == hf_tokens
    assert same_score(out.score, hf_score)


# -- exact speculative beam search equals plain beam search ---------------------------------------


@pytest.fixture(scope="module")
def spec_setup():
    target = with_eos_in_play(*MODELS["qwen2"])
    plain = {w: beam_search(target, PROMPT, num_beams=w, max_new_tokens=N_NEW) for w in (2, 3, 5)}
    drafts = {
        "good (perturbed copy)": perturbed(target, 0.05),
        "poor (heavily perturbed)": perturbed(target, 1.0, seed=7),
        "target as its own draft": target,
        "bigram (from the prompt)": "bigram",
    }
    return target, plain, drafts


@pytest.mark.parametrize("gamma", [1, 2, 4])
@pytest.mark.parametrize("w", [2, 3, 5])
def test_exact_speculative_beam_search_equals_plain(spec_setup, w, gamma):
    target, plain, drafts = spec_setup
    for name, draft in drafts.items():
        for u in (w, w + 2):
            out = beam_search(target, PROMPT, num_beams=w, max_new_tokens=N_NEW, draft=draft, draft_beams=u,
                              gamma=gamma)
            label = f"{name}, w={w}, u={u}, gamma={gamma}"
            assert out.token_ids == plain[w].token_ids, label
            assert out.score == pytest.approx(plain[w].score, abs=1e-5), label
            s = out.stats
            assert s["steps"] == plain[w].stats["steps"], label
            assert s["target_calls"] <= plain[w].stats["target_calls"], label
            assert s["exact"] is True and s["mode"] == "exact", label
            if name == "target as its own draft" and u == w:
                # The draft's beam search is then the target's: every drafted step is accepted. (With
                # u > w the draft's extra beams can crowd one of the target's continuations out.)
                assert s["accepted_steps"] == s["drafted_steps"], label
                if gamma > 1:
                    assert s["target_calls"] < plain[w].stats["target_calls"], label


def test_exact_speculative_on_llama(eos_target):
    for w, gamma in ((3, 2), (3, 4)):
        plain = beam_search(eos_target, PROMPT, num_beams=w, max_new_tokens=N_NEW)
        corpus = NGramDrafter(order=2, corpus_ids=PROMPT + plain.token_ids)  # a fixed bigram model
        for draft in (perturbed(eos_target, 0.05), eos_target, "unigram", corpus):
            out = beam_search(eos_target, PROMPT, num_beams=w, max_new_tokens=N_NEW, draft=draft, draft_beams=w + 1,
                              gamma=gamma)
            assert out.token_ids == plain.token_ids


def test_good_draft_saves_target_calls(spec_setup):
    target, plain, drafts = spec_setup
    out = beam_search(target, PROMPT, num_beams=3, max_new_tokens=N_NEW, draft=drafts["good (perturbed copy)"],
                      draft_beams=5, gamma=4)
    assert out.token_ids == plain[3].token_ids
    assert out.stats["accepted_steps"] > 0
    assert out.stats["target_calls"] < plain[3].stats["target_calls"]
    # every target call yields one beam step, plus the steps accepted from the draft tree
    assert out.stats["target_calls"] == out.stats["steps"] - out.stats["accepted_steps"]


def test_max_new_tokens_is_respected_with_a_draft(spec_setup):
    target, _, drafts = spec_setup
    for n in (1, 2, 3, 6):
        plain = beam_search(target, PROMPT, num_beams=2, max_new_tokens=n)
        out = beam_search(target, PROMPT, num_beams=2, max_new_tokens=n, draft=target, gamma=4)
        assert out.token_ids == plain.token_ids and len(out.token_ids) <= n


def test_ngram_distribution_is_the_smoothed_q_and_only_observe_learns():
    d = NGramDrafter(order=2)
    d.start(DraftContext([7, 8, 7, 9], SamplingParams(temperature=1.0), torch.Generator(), 12))
    q = d.distribution([5, 7])
    expected = torch.zeros(12)
    expected[[7, 8, 9]] = torch.tensor([0.1 * 2 / 4, 0.9 / 2 + 0.1 / 4, 0.9 / 2 + 0.1 / 4])
    assert torch.allclose(q, expected)
    assert d.counts_after(7) == {8: 1, 9: 1}  # distribution() did not learn
    d.observe([7, 8, 7, 9, 7, 8])
    assert d.counts_after(7) == {8: 2, 9: 1}


def test_beam_cache_grows_when_a_pass_needs_more_positions(spec_setup, monkeypatch):
    import specdec.beam.exact
    import specdec.beam.report

    target, plain, drafts = spec_setup
    options = dict(num_beams=3, max_new_tokens=N_NEW, draft_beams=4, gamma=3, seed=1)
    before = [beam_search(target, PROMPT, draft=d, mode=m, **options).token_ids
              for d in (drafts["good (perturbed copy)"], "bigram") for m in ("exact", "report")]
    for module in (specdec.beam.exact, specdec.beam.report):
        monkeypatch.setattr(module, "initial_capacity", lambda prompt_length, limit: 2)
    after = [beam_search(target, PROMPT, draft=d, mode=m, **options).token_ids
             for d in (drafts["good (perturbed copy)"], "bigram") for m in ("exact", "report")]
    assert after == before and before[0] == plain[3].token_ids


# -- the report's Algorithm 2 (approximate) -------------------------------------------------------


def target_log_prob(target, prompt, tokens):
    with torch.inference_mode():
        logits = target.hf_model(torch.tensor([prompt + tokens])).logits[0].float()
    logp = torch.log_softmax(logits[len(prompt) - 1: -1], dim=-1)
    return float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def test_report_mode_runs_and_is_labelled_approximate(spec_setup):
    target, _, drafts = spec_setup
    eos = target.eos_token_ids
    for draft in (drafts["good (perturbed copy)"], "bigram", "prompt-lookup", None):
        options = dict(num_beams=3, max_new_tokens=N_NEW, draft=draft, gamma=3, mode="report", seed=5)
        out = beam_search(target, PROMPT, **options)
        again = beam_search(target, PROMPT, **options)
        assert out.token_ids == again.token_ids  # seeded
        assert out.stats["exact"] is False and out.stats["mode"] == "report"
        assert 1 <= len(out.token_ids) <= N_NEW
        assert all(t not in eos for t in out.token_ids[:-1])
        assert (out.stats["stop_reason"] == "eos") == (out.token_ids[-1] in eos)
        # the score is the target's log-probability of the output, length-penalised
        expected = target_log_prob(target, PROMPT, out.token_ids) / len(out.token_ids)
        assert out.score == pytest.approx(expected, abs=1e-4)


def test_report_mode_with_the_target_as_draft_accepts_nearly_everything(spec_setup):
    target = spec_setup[0]
    out = beam_search(target, PROMPT, num_beams=2, max_new_tokens=N_NEW, draft=target, gamma=3, mode="report", seed=0)
    assert out.stats["acceptance_rate"] > 0.95  # p == q up to rounding: r < p/q almost surely


# -- bad input ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(num_beams=0), "num_beams must be an integer >= 1"),
        (dict(num_beams=True), "num_beams must be an integer >= 1"),
        (dict(num_beams=3, draft="bigram", draft_beams=2), "draft_beams"),
        (dict(num_beams=2, draft="bigram", gamma=0), "gamma must be an integer >= 1"),
        (dict(num_beams=2, draft="bigram", mode="fast"), "unknown beam mode 'fast'"),
        (dict(num_beams=2, draft="prompt-lookup"), "prompt lookup gives no probabilities"),
        (dict(num_beams=2, max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
        (dict(num_beams=2, early_stopping="sometimes"), "early_stopping must be"),
        (dict(num_beams=2, length_penalty="long"), "length_penalty must be a finite number"),
    ],
)
def test_bad_input_raises_clear_errors(tiny, options, message):
    options = {"max_new_tokens": 4, **options}
    with pytest.raises(SpecDecError, match=message):
        beam_search(tiny, PROMPT, **options)


def test_encoder_decoder_target_and_empty_prompt_are_rejected(tiny):
    with pytest.raises(SpecDecError, match="decoder-only"):
        beam_search(tiny_seq2seq("t5"), PROMPT, num_beams=2, max_new_tokens=4)
    with pytest.raises(SpecDecError, match="prompt is empty"):
        beam_search(tiny, [], num_beams=2, max_new_tokens=4)


# -- a real model ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_beam_search_equals_transformers_and_speculative_equals_plain():
    model = specdec.load("smollm2-135m", dtype="fp32")
    prompt = model.encode("The quick brown fox jumps over the lazy dog. The quick brown fox")
    hf_tokens, hf_score = hf_beam(model, prompt, 3, 20)
    plain = beam_search(model, prompt, num_beams=3, max_new_tokens=20)
    assert plain.token_ids == hf_tokens
    assert plain.score == pytest.approx(hf_score, abs=1e-5)
    for draft in ("bigram", model):
        out = beam_search(model, prompt, num_beams=3, max_new_tokens=20, draft=draft, draft_beams=4, gamma=3)
        assert out.token_ids == plain.token_ids, getattr(draft, "name", draft)
        assert out.stats["target_calls"] <= plain.stats["target_calls"]
    assert math.isfinite(plain.score)
