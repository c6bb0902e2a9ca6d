"""Predicted Outputs (specdec.drafters.prediction): the expected text as an exact draft in front of the configured
one. The output with a prediction is the output without it (greedy, token for token; at T = 1 the target's
distribution), whatever the prediction's quality; the counts add up; alignment re-synchronises after insertions,
deletions and changed words; bad predictions are clear errors, in the API, the CLI and the server."""

import json

import pytest
import torch

import specdec
from specdec.batch.engine import BatchEngine
from specdec.config import GenerationConfig
from specdec.drafters.base import Draft, DraftContext, DrafterBase
from specdec.drafters.prediction import MIN_MATCH, RESYNC_REACH, YOUNG, PredictionDrafter, align, replace_all
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from test_distribution import PROMPT as DIST_PROMPT, V, exact_joint
from tiny import load_tiny, perturbed

A, B, C, D, E, F, G, H = range(10, 18)  # token ids of a "source file"
LINE1, LINE2, LINE3 = [A, B, C, 5], [D, E, F, 5], [G, H, A, 5]  # three "lines" ending in a newline token 5
SOURCE = LINE1 + LINE2 + LINE3


@pytest.mark.parametrize("output, prediction, anchor, expected", [
    ([], SOURCE, 0, 0),  # nothing written yet: the prediction's start
    (LINE1, SOURCE, 0, 4),  # on it: the next line is next
    (LINE1 + [99, 98, 97, 5], SOURCE, 4, None),  # an inserted line: off the prediction (the draft drafts it)
    (LINE1 + [99, 98, 97], SOURCE, 4, None),
    (LINE1 + [99, 98, 97, 5, D, E], SOURCE, 4, 6),  # the newline and two tokens after it: back on it
    (LINE1 + [99, 98, 97, 5, D, E, F], SOURCE, 4, 7),
    (LINE1 + [G, H, A], SOURCE, 4, 11),  # a deleted line: the output skipped LINE2 and rejoined at LINE3
    ([A, B, 42, 5, D], SOURCE, 0, None),  # a changed word: two tokens since are no evidence yet (MIN_MATCH 3)
    ([A, B, 42, 5, D, E], SOURCE, 0, 6),  # ... three are
    (LINE1 + LINE1, LINE1 + LINE1 + LINE2, 4, 8),  # a repeated line: the longest match places it
    ([B, C, 5], SOURCE, 0, 4),
])
def test_alignment(output, prediction, anchor, expected):
    assert align(output, prediction, anchor) == expected
    assert MIN_MATCH == 3


def test_a_repeated_line_keeps_its_order():
    prediction = LINE1 + LINE2 + LINE1 + LINE3
    assert align(LINE1, prediction, 0) == 4 and align(LINE1, prediction, 9) == 12  # the one after the anchor
    assert align(LINE1, prediction, 20) == 12  # none after it: the last one before


def test_replace_all_replaces_every_occurrence_left_to_right_without_overlaps():
    assert replace_all([1, 2, 3, 1, 2], [1, 2], [1, 2, 9]) == [1, 2, 9, 3, 1, 2, 9]  # an insertion after each
    assert replace_all([7, 7, 7], [7, 7], [8]) == [8, 7]  # not overlapping
    assert replace_all([1, 2, 3], [4], [5]) == [1, 2, 3]


class _Recording(DrafterBase):
    """A configured draft that proposes nothing and records its starts."""

    name = "recording"

    def __init__(self):
        self.starts = 0

    def start(self, context):
        super().start(context)
        self.starts += 1

    def propose(self, sequence, k):
        return Draft.empty(self.context.device)


def _decode(drafter, prompt, truth, gamma=4):
    """Greedy verification by hand: each round the drafter proposes, the longest prefix that ``truth`` continues
    with is accepted and the target's own token follows. The (k, accepted) of each round."""
    drafter.start(DraftContext(prompt, SamplingParams(), torch.Generator(), 100, max_positions=len(prompt) + 200))
    sequence, rounds = list(prompt), []
    while len(sequence) - len(prompt) < len(truth):
        k = drafter.reach(sequence, gamma)
        draft = drafter.propose(sequence, k).tokens.tolist()
        ahead = truth[len(sequence) - len(prompt):]
        n = next((i for i, (d, t) in enumerate(zip(draft, ahead)) if d != t), min(len(draft), len(ahead)))
        n = min(n, len(ahead) - 1)
        drafter.update(n)
        rounds.append((len(draft), n))
        sequence += ahead[: n + 1]
    assert sequence[len(prompt):] == truth
    return rounds


NAME, V2 = [40, 41], [42, 43]  # a function's name in two pieces, and the "_v2" a rename appends
RENAME = [1, 50, *NAME, 51, *NAME, *V2, 52]  # the request: "rename `name` to `name_v2`"


def _file(name):
    """A "source file" that uses ``name`` three times, each followed by "(" (token 7). (An output ends with an end
    token, 99, past the prediction.)"""
    body = [20, 21, 22, 23, 24, 25, 26, 27]
    return ([30, 31, *name, 7, 32, 33, 34, 5] + body + [35, *name, 7, 36, 37, 5] + body[::-1]
            + [38, *name, 7, 39, 5])


def test_an_edit_made_once_is_drafted_where_its_text_comes_again():
    """A renamed function: the output departs from the prediction at the first use of the name, rejoins one token
    later ("(", within the re-synchronisation window), and from then on the prediction has the new name in its
    later uses: one departure in three uses, the rest of the output drafted from the prediction."""
    prediction, truth = _file(NAME), _file(NAME + V2) + [99]
    drafter = PredictionDrafter(prediction, inner=_Recording())
    rounds = _decode(drafter, RENAME, truth)
    assert drafter.departures == 1 and drafter.edits == 1
    assert drafter.prediction == truth[:-1]  # (edited: every use renamed)
    assert rounds[1][1] == 1  # copying from the request drafted the "_v2"'s second piece
    assert all(n == k for k, n in rounds[2:])  # and from then on every proposal was right
    assert drafter.inner.starts == 0  # the inserted tokens came from the context (copying), not the draft model


def test_a_one_off_edit_is_learned_back_where_the_output_keeps_the_old_text():
    """The output renames the first use only: the learned edit is wrong at the next use, the output departs there,
    and the edit back is learned (the last use is drafted right)."""
    prediction = _file(NAME)
    first = prediction.index(7)
    truth = prediction[:first] + V2 + prediction[first:] + [99]
    drafter = PredictionDrafter(prediction, inner=_Recording())
    _decode(drafter, RENAME, truth)
    assert drafter.departures == 2 and drafter.edits == 2


@pytest.mark.parametrize("truth_kind", ["correct", "new line"])
def test_the_configured_draft_starts_only_where_the_prediction_and_copying_run_out(truth_kind):
    """On the prediction (and up to YOUNG tokens off it, which copying from the context drafts) the configured draft
    is never started, so a model draft's catch-up is not paid; an inserted block of new text longer than that
    starts it."""
    prediction = _file(NAME)
    new_line = list(range(60, 61 + YOUNG)) + [5]
    truth = (prediction if truth_kind == "correct" else prediction[:11] + new_line + prediction[11:]) + [99]
    drafter = PredictionDrafter(prediction, inner=_Recording())
    _decode(drafter, RENAME, truth)
    assert drafter.inner.starts == (0 if truth_kind == "correct" else 1)
    assert drafter.stats().levels == []


@pytest.mark.parametrize("inserted", [2, YOUNG - 2])
def test_a_short_insertion_is_written_without_the_configured_draft(inserted):
    """A new line of up to YOUNG tokens (a guard statement) is the target's own steps (or copying), not the draft
    model's: its catch-up costs more than such a line gains."""
    prediction = _file(NAME)
    truth = prediction[:11] + list(range(60, 60 + inserted)) + [5] + prediction[11:] + [99]
    drafter = PredictionDrafter(prediction, inner=_Recording())
    _decode(drafter, RENAME, truth)
    assert drafter.inner.starts == 0 and drafter.departures == 1


def test_a_rejoin_found_by_alignment_far_from_the_departure_proposes_short_until_confirmed():
    """The output leaves the prediction, writes new text, and rejoins it past the re-synchronisation window (a
    replaced stretch): the longest-suffix alignment finds it, and its first proposal there is at most RESYNC_REACH
    (a three-token match far away can be chance); once confirmed the proposals grow again."""
    prediction = list(range(100, 160))  # 60 distinct tokens
    truth = prediction[:20] + [60, 61, 62, 63] + prediction[40:] + [99]  # 20 predicted tokens replaced by 4 new
    drafter = PredictionDrafter(prediction, inner=None)
    drafter.start(DraftContext([1, 2], SamplingParams(), torch.Generator(), 100, max_positions=200))
    sequence = [1, 2] + truth[:27]  # the new text and three tokens of the prediction's 40-42
    drafter.rounds, drafter.alpha, drafter.left = 3, 0.999, (20, 20)
    assert drafter.reach(sequence, 4) == RESYNC_REACH
    draft = drafter.propose(sequence, RESYNC_REACH).tokens.tolist()
    assert draft == prediction[43: 43 + RESYNC_REACH]
    drafter.update(RESYNC_REACH)
    assert drafter.reach(sequence + draft + [prediction[43 + RESYNC_REACH]], 4) > RESYNC_REACH


@pytest.fixture(scope="module")
def pair():
    target = load_tiny(eos=None)
    return target, perturbed(target, 0.3)


def predictions(plain_ids):
    """A correct, a partly wrong (an insertion and a deletion) and an entirely wrong prediction of ``plain_ids``."""
    ids = list(plain_ids)
    wrong = [int(t) for t in torch.randint(3, 60, (len(ids),), generator=torch.Generator().manual_seed(0))]
    return {"correct": ids, "partly wrong": ids[:8] + [30, 31, 32] + ids[8:20] + ids[24:], "wrong": wrong}


@pytest.mark.parametrize("quality", ["correct", "partly wrong", "wrong"])
@pytest.mark.parametrize("draft_kind", ["model", "none"])
def test_greedy_output_with_a_prediction_is_the_output_without_it(pair, quality, draft_kind):
    from specdec.drafters.model import ModelDrafter

    target, model = pair
    prompt = [1, 10, 11, 12, 13]
    plain = specdec.generate(target, prompt, draft=None, max_new_tokens=40)
    drafter = PredictionDrafter(predictions(plain.token_ids)[quality],
                                inner=ModelDrafter(model) if draft_kind == "model" else None)
    sources = []
    out = specdec.generate(target, prompt, draft=drafter, max_new_tokens=40,
                           on_round=lambda event: sources.append((event.source, event.accepted)))
    assert out.token_ids == plain.token_ids
    report = out.stats.prediction
    # each round says where its draft came from: the accepted tokens from the prediction are OpenAI's count
    assert sum(n for source, n in sources if source == "prediction") == report["accepted_prediction_tokens"]
    assert report["accepted_prediction_tokens"] + report["rejected_prediction_tokens"] <= out.stats.drafted
    assert report["accepted_prediction_tokens"] <= out.stats.accepted
    if draft_kind == "none":  # every drafted token came from the prediction: the counts are the stats'
        assert report["accepted_prediction_tokens"] == out.stats.accepted
        assert report["accepted_prediction_tokens"] + report["rejected_prediction_tokens"] == out.stats.drafted
    if quality == "correct":
        assert out.stats.target_calls <= 4  # many tokens a round (16, then as far as its record allows)
        assert report["rejected_prediction_tokens"] == 0 and report["accepted_prediction_tokens"] >= 36
    if quality == "partly wrong":
        assert report["accepted_prediction_tokens"] >= 20  # it re-synchronised after the insertion and the deletion


def test_the_prediction_text_is_tokenized_without_special_tokens(pair):
    target, model = pair
    text = "w1 w2 w3 w4 w5 w6"
    out = specdec.generate(target, [1, 10, 11], draft=model, max_new_tokens=12, prediction=text)
    assert out.token_ids == specdec.generate(target, [1, 10, 11], draft=None, max_new_tokens=12).token_ids
    assert out.stats.prediction["prediction_tokens"] == len(target.tokenizer(text, add_special_tokens=False)["input_ids"])
    assert specdec.generate(target, [1, 10, 11], draft=model, max_new_tokens=4, prediction="").stats.prediction == {}


def test_at_temperature_one_a_prediction_draft_follows_the_target():
    target = load_tiny(vocab=V, eos=None, sharp=2.0)
    sampling = SamplingParams(temperature=1.0)
    counts = torch.zeros(V * V)
    for seed in range(2000):
        drafter = PredictionDrafter([3, 5, 2, 7], inner=None)  # one-hot drafts, right or wrong
        out = specdec.generate(target, DIST_PROMPT, draft=drafter, max_new_tokens=2, seed=seed, temperature=1.0)
        counts[out.token_ids[0] * V + out.token_ids[1]] += 1
    assert chi_square_pvalue(counts.numpy(), exact_joint(target, sampling).numpy()) > 1e-3


def test_batched_rows_with_predictions_equal_their_generation_alone(monkeypatch):
    """Rows of a batch (and a row alone: the one-sequence engine) with their own predictions, plain and
    model-drafted rows beside them. (The predictions' texts stand for the expected outputs' ids here: a tiny model's
    text need not give back its ids.)"""
    import specdec.decoding as decoding
    from test_quantize import quantized_copy

    base = load_tiny(eos=None, hidden=128)
    target, model = quantized_copy(base, "int8"), quantized_copy(perturbed(base, 0.1), "int8")
    prompts = [[1, 10, 11, 12], [1, 13, 14, 15, 16], [1, 20, 21], [1, 30, 31, 32]]
    expected = [specdec.generate(target, p, draft=None, max_new_tokens=30).token_ids for p in prompts]
    texts = {f"prediction {i}": predictions(e)["partly wrong" if i == 1 else "correct"] for i, e in enumerate(expected)}
    monkeypatch.setattr(decoding, "prediction_ids", lambda target, config: texts.get(config.prediction, []))
    configs = [GenerationConfig(max_new_tokens=30, prediction=f"prediction {i}" if i != 2 else None)
               for i in range(len(prompts))]
    engine = BatchEngine(target, model, max_batch=3, speculation="rows")
    rows = [engine.add(p, c, draft=None if i == 3 else "model") for i, (p, c) in enumerate(zip(prompts, configs))]
    engine.run()
    assert [r.output.token_ids for r in rows] == expected
    assert rows[0].output.stats.prediction["accepted_prediction_tokens"] > 10 and not rows[2].output.stats.prediction
    alone = [specdec.generate(target, p, draft=None if i == 3 else model, config=c)
             for i, (p, c) in enumerate(zip(prompts, configs))]
    assert [a.token_ids for a in alone] == expected


def test_bad_predictions_are_clear_errors(pair):
    target, _ = pair
    with pytest.raises(SpecDecError, match="prediction must be the expected output's text"):
        GenerationConfig(prediction=["x"])
    assert GenerationConfig(prediction="").prediction is None  # empty: no prediction
    with pytest.raises(SpecDecError, match="beam search .* does not support a prediction"):
        GenerationConfig(num_beams=2, prediction="x")
    long_text = " ".join(["w1"] * (target.max_context + 10))
    with pytest.raises(SpecDecError, match="the prediction has .* tokens but .* reads at most"):
        specdec.generate(target, [1, 2], draft=None, prediction=long_text, max_new_tokens=2)


def test_the_cli_reads_a_prediction_file(tmp_path, capsys):
    from specdec import cli

    missing = tmp_path / "none.txt"
    assert cli.main(["generate", "x", "--prediction", str(missing)]) == 2
    assert "cannot read the prediction file" in capsys.readouterr().err
    assert cli.main(["generate", "-", "--prediction", "-"]) == 2
    assert "cannot both come from standard input" in capsys.readouterr().err


def test_the_server_takes_openais_prediction_and_reports_its_counts(monkeypatch):
    from starlette.testclient import TestClient

    from serving import wait_until
    from specdec import cli
    from specdec.cli import serve
    from specdec.serve.app import create_app

    target = load_tiny(eos=None)
    monkeypatch.setattr(serve, "load_models", lambda args, tokenizer=None: (target, perturbed(target, 0.3)))
    plain = specdec.generate(target, [1, 10, 11], draft=None, max_new_tokens=20)
    predicted = target.decode(plain.token_ids)
    import specdec.decoding as decoding  # (a tiny model's text need not give back its ids: the text stands for them)
    monkeypatch.setattr(decoding, "prediction_ids", lambda target, config: list(plain.token_ids) if config.prediction else [])
    for batch in ("1", "2"):
        args = cli.build_parser().parse_args(["serve", "--target", "tiny", "--max-batch", batch, "--max-positions", "200"])
        with TestClient(create_app(lambda: cli.load_served(args), max_batch=int(batch))) as http:
            wait_until(lambda: http.get("/health").status_code == 200, 60, "the server to be ready")
            body = {"model": "tiny", "prompt": [1, 10, 11], "max_tokens": 20}
            for content in (predicted, [{"type": "text", "text": predicted[:5]}, {"type": "text", "text": predicted[5:]}]):
                reply = http.post("/v1/completions", json={**body, "prediction": {"type": "content", "content": content}})
                out = reply.json()
                assert reply.status_code == 200 and out["choices"][0]["text"] == predicted
                details = out["usage"]["completion_tokens_details"]
                assert details["accepted_prediction_tokens"] > 10, details
            assert "completion_tokens_details" not in http.post("/v1/completions", json=body).json()["usage"]
            # streamed (the playground): each round says whether its draft came from the prediction
            events = [json.loads(line[6:]) for line in http.post("/v1/completions", json={
                **body, "stream": True, "prediction": {"type": "content", "content": predicted}}).text.splitlines()
                if line.startswith("data: {")]
            rounds = [e["specdec"] for e in events if "draft_text" in e.get("specdec", {})]
            from_prediction = sum(r["from_draft"] for r in rounds if r["from_prediction"])
            assert from_prediction > 10 and all(r["from_draft"] == 0 for r in rounds if not r["from_prediction"])
            assert "".join(r["draft_text"] + r["target_text"] for r in rounds) == predicted
            for bad in ({"type": "text", "content": "x"}, "x", {"type": "content", "content": 3},
                        {"type": "content", "content": [{"type": "image"}]}):
                reply = http.post("/v1/completions", json={**body, "prediction": bad})
                assert reply.status_code == 400 and reply.json()["error"]["param"] == "prediction", bad


def test_the_proposal_length_follows_the_measured_pass_cost():
    """Theorem 8 with c = 0: dear wide passes (cost linear in the tokens, steep) give short proposals, flat ones
    long; before any timed pass the measured prior of the int4 target (PASS_COST_*)."""
    from specdec.drafters.prediction import PASS_COST_BASE, PASS_COST_PER_TOKEN

    drafter = PredictionDrafter(list(range(10, 110)))
    drafter.rounds, drafter.alpha = 3, 0.95
    drafter.prompt_length = 0
    assert drafter.pass_cost(33) == pytest.approx(PASS_COST_BASE + PASS_COST_PER_TOKEN * 33)
    prior = drafter.reach(list(range(10, 20)), 4)
    for k in (1, 5, 9, 17):  # flat: a pass over k tokens costs what one costs
        drafter.observe_pass(k, 0.030)
    flat = drafter.reach(list(range(10, 20)), 4)
    steep = PredictionDrafter(list(range(10, 110)))
    steep.rounds, steep.alpha, steep.prompt_length = 3, 0.95, 0
    for k in (1, 5, 9, 17):
        steep.observe_pass(k, 0.030 * k)
    assert steep.reach(list(range(10, 20)), 4) == 4 < prior < flat  # (no gain over the draft's own gamma when steep)


def test_the_first_pass_and_passes_of_neighbouring_sizes_do_not_decide_the_proposal_length():
    """A generation's first pass (its first-pass costs) is not kept, and timed passes of nearly one size (their
    noise) leave the prior in charge: a slow first wide pass cannot hold the proposals at the draft's gamma."""
    from specdec.drafters.prediction import MEASURED_SPAN, PASS_COST_BASE, PASS_COST_PER_TOKEN

    drafter = PredictionDrafter(list(range(10, 110)))
    drafter.observe_pass(17, 0.500)  # the first pass: 10x what its width costs
    drafter.observe_pass(5, 0.030)
    drafter.observe_pass(6, 0.200)  # a noisy neighbour: alone they would say 170 ms a token
    assert 17 not in drafter.passes and MEASURED_SPAN > 1
    assert drafter.pass_cost(33) == pytest.approx(PASS_COST_BASE + PASS_COST_PER_TOKEN * 33)
    drafter.observe_pass(5 + MEASURED_SPAN, 0.040)  # a span of sizes: the measured line decides
    assert drafter.pass_cost(33) != pytest.approx(PASS_COST_BASE + PASS_COST_PER_TOKEN * 33)


@pytest.mark.parametrize("written, expected", [  # expected: what the prediction proposes next (None: still off it)
    ([90, 20], [21, 22]),  # an inserted token, then the one where the output left: back on it (a lone match)
    ([90, 22], [23, 24]),  # a changed token, then two on: a lone match 3 tokens on is still one (a short change)
    ([90, 25], None),  # a lone token 6 on: an indent inside new code is no evidence
    ([90, 24, 25], [26, 27]),  # two of them are
])
def test_a_departure_rejoins_on_one_token_close_to_where_it_left_or_two_further(written, expected):
    prediction = [20, 21, 22, 23, 24, 25, 26, 27, 28]
    drafter = PredictionDrafter(prediction)
    drafter.prompt_length, drafter.left = 0, (0, 0)
    found = drafter.resync(written)
    assert (drafter.prediction[found[0]: found[0] + 2] if found else None) == expected
    if expected is not None:  # the first proposal after it is short until it is confirmed
        drafter.rounds, drafter.alpha = 3, 0.999
        assert drafter.reach(written, 4) == 8
