"""Encoder-decoder targets and drafts (T5, BART) on tiny random models built from configs."""

import pytest
import torch

import specdec
from specdec import SpecDecError
from specdec.models.seq2seq import Seq2SeqLanguageModel, Seq2SeqSession
from specdec.sampling import SamplingParams, standardize
from stats_util import chi_square_pvalue
from tiny import load_tiny, perturbed, tiny_seq2seq

SOURCE = [10, 11, 12, 13, 14, 15, 10, 11, 12, 16]
N_NEW = 30


@pytest.fixture(scope="module", params=["t5", "bart"])
def target(request):
    return tiny_seq2seq(request.param, eos=None)


def test_load_detects_the_model_type(target):
    assert isinstance(target, Seq2SeqLanguageModel) and target.is_encoder_decoder


@pytest.mark.parametrize("gamma", [1, 2, 4, 8])
def test_greedy_speculative_equals_plain_and_transformers(target, gamma):
    plain = specdec.generate(target, SOURCE, max_new_tokens=N_NEW)
    assert len(plain.token_ids) == N_NEW
    with torch.inference_mode():
        hf = target.hf_model.generate(torch.tensor([SOURCE]), do_sample=False, max_new_tokens=N_NEW)
    assert hf[0, 1:].tolist() == plain.token_ids  # hf output starts with the decoder start token
    drafts = {
        "good": perturbed(target, 0.05),
        "poor": perturbed(target, 1.0, seed=5),
        "itself": target,
        "prompt-lookup": "prompt-lookup",
        "bigram": "bigram",
    }
    for name, draft in drafts.items():
        out = specdec.generate(target, SOURCE, draft=draft, gamma=gamma, max_new_tokens=N_NEW)
        assert out.token_ids == plain.token_ids, (name, gamma)


def test_smaller_seq2seq_draft(target):
    kind = "t5" if "t5" in target.name else "bart"
    small = tiny_seq2seq(kind, seed=9, d_model=32, layers=1, eos=None)
    plain = specdec.generate(target, SOURCE, max_new_tokens=N_NEW)
    out = specdec.generate(target, SOURCE, draft=small, gamma=3, max_new_tokens=N_NEW)
    assert out.token_ids == plain.token_ids and out.stats.draft_calls > 0


def test_prompt_lookup_copies_from_the_source():
    target = tiny_seq2seq("t5", eos=None)
    plain = specdec.generate(target, SOURCE, max_new_tokens=N_NEW)
    # A source that contains the target's own greedy output: copying from it is accepted.
    source = SOURCE + plain.token_ids
    plain2 = specdec.generate(target, source, max_new_tokens=N_NEW)
    out = specdec.generate(target, source, draft="prompt-lookup", gamma=4, max_new_tokens=N_NEW)
    assert out.token_ids == plain2.token_ids
    assert out.stats.drafted > 0


def test_decoder_rollback_matches_a_fresh_forward(target):
    session, seq = target.start(SOURCE)
    session.logits_of(seq + [20, 21, 22, 23], 5)
    session.logits_of(seq + [20, 30], 2)  # rollback of 3 self-attention positions
    logits = session.logits_of(seq + [20, 30, 31, 32], 2)
    with torch.inference_mode():
        fresh = target.hf_model(input_ids=torch.tensor([SOURCE]),
                                decoder_input_ids=torch.tensor([seq + [20, 30, 31, 32]])).logits[0, -2:]
    torch.testing.assert_close(logits, fresh, rtol=1e-4, atol=1e-4)
    assert isinstance(session, Seq2SeqSession)


def test_first_two_tokens_follow_the_target_distribution():
    V = 8
    target = tiny_seq2seq("t5", vocab=V, eos=None)
    draft = perturbed(target, 1.0, seed=2)
    source = [1, 2, 3, 4]
    sampling = SamplingParams(temperature=1.0)
    start = target.decoder_start_token_id
    with torch.inference_mode():
        enc = torch.tensor([source])
        p1 = standardize(target.hf_model(input_ids=enc, decoder_input_ids=torch.tensor([[start]])).logits[0, -1], sampling)
        dec = torch.tensor([[start, x] for x in range(V)])
        p2 = standardize(target.hf_model(input_ids=enc.expand(V, -1), decoder_input_ids=dec).logits[:, -1], sampling)
    probs = (p1[:, None] * p2).flatten()
    counts = torch.zeros(V * V)
    for seed in range(4000):
        out = specdec.generate(target, source, draft=draft, gamma=2, max_new_tokens=2, temperature=1.0, seed=seed)
        counts[out.token_ids[0] * V + out.token_ids[1]] += 1
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


def test_decoder_only_draft_for_a_seq2seq_target_is_an_error():
    target = tiny_seq2seq("t5")
    with pytest.raises(SpecDecError, match="is a decoder-only model but the target is an encoder-decoder model"):
        specdec.generate(target, SOURCE, draft=load_tiny())


def test_mismatched_vocabularies():
    target = tiny_seq2seq("t5")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "<pad>"] + [f"y{i}" for i in range(92)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    other = tiny_seq2seq("t5", seed=4)
    other.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    with pytest.raises(SpecDecError, match="does not share the target's vocabulary"):
        specdec.generate(target, SOURCE, draft=other)


def test_empty_source_and_chat():
    target = tiny_seq2seq("t5")
    with pytest.raises(SpecDecError, match="prompt is empty"):
        specdec.generate(target, "")
    with pytest.raises(SpecDecError, match="chat=True is for decoder-only"):
        specdec.generate(target, "w1 w2", chat=True)


def test_cli_with_a_local_seq2seq_folder(tmp_path, capsys):
    import json

    from specdec import cli

    target = tiny_seq2seq("t5", eos=None)
    target.hf_model.save_pretrained(tmp_path)
    target.tokenizer.save_pretrained(tmp_path)
    code = cli.main(["generate", "w6 w7 w8 w9 w6 w7", "--target", str(tmp_path), "--draft", "prompt-lookup",
                     "--dtype", "fp32", "--max-new-tokens", "8", "--json"])
    doc = json.loads(capsys.readouterr().out)
    api = specdec.generate(specdec.load(str(tmp_path), dtype="fp32"), "w6 w7 w8 w9 w6 w7", max_new_tokens=8)
    assert code == 0 and doc["token_ids"] == api.token_ids and len(api.token_ids) == 8
