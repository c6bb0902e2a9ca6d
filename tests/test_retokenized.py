"""A draft with another tokenizer than the target's (specdec.drafters.retokenized).

The target is the tiny word-level model (one token per word, "w0".."w91"); the drafts use byte-level
BPE tokenizers built here: one token per character ("char": every token but a word's last ends
mid-word) and one with merges across spaces ("bpe": tokens such as "0 w1" end mid-word too).
"""

from __future__ import annotations

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import specdec
from specdec.drafters import DraftContext, RetokenizedDrafter, make_drafter
from specdec.drafters.retokenized import TokenText
from specdec.errors import SpecDecError
from specdec.sampling import SamplingParams
from stats_util import chi_square_pvalue
from tiny import VOCAB, load_tiny, perturbed, tiny_model
from test_distribution import PROMPT as EXACT_PROMPT, exact_joint

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
PROMPT = "w1 w2 w3"


def byte_bpe(words: int = 92, merges: int = 0, seed: int = 0, all_bytes: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on random sentences of words w0..w{words-1}; merges=0: one token per character.
    all_bytes: every byte is a token (any text can be written); otherwise only the corpus's characters."""
    rng = random.Random(seed)
    corpus = [" ".join(f"w{rng.randrange(words)}" for _ in range(20)) for _ in range(200)]
    initial = pre_tokenizers.ByteLevel.alphabet() if all_bytes else []
    alphabet = len(SPECIALS) + len(set("".join(corpus)) | set(initial)) + (1 if all_bytes else 0)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)  # merges cross spaces
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=alphabet + merges, special_tokens=SPECIALS,
                                                        initial_alphabet=initial, show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")


def tiny_draft(tokenizer, seed: int = 5, eos: int | None = None, sharp: float = 3.0) -> specdec.LanguageModel:
    return specdec.load(tiny_model(vocab=len(tokenizer), seed=seed, eos=eos, sharp=sharp), tokenizer=tokenizer,
                        name=f"tiny-draft-{len(tokenizer)}")


class OracleSession:
    """Spells ``reference`` text: after a prefix of it, all mass on the first token of the rest's encoding."""

    capacity = None  # as a dynamic session: as many positions as the model's context

    def __init__(self, model: "OracleModel"):
        self.model, self.ids, self.forward_passes = model, [], 0

    @property
    def length(self) -> int:
        return len(self.ids)

    def prefill(self, ids):
        return self.extend(ids, 1)[0] if len(ids) else None

    def extend(self, tokens, n_logits=1):
        self.ids.extend(int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens))
        self.forward_passes += 1
        return torch.stack([self.model.logits(self.ids[:j]) for j in range(len(self.ids) - n_logits + 1, len(self.ids) + 1)])

    def rollback(self, length):
        del self.ids[length:]

    def close(self):
        pass


class OracleModel:
    """A stand-in draft model with its own tokenizer that knows the target's text (``reference``)."""

    eos_token_ids: set[int] = set()
    max_context = None

    def __init__(self, tokenizer, reference: str):
        self.tokenizer, self.reference, self.name = tokenizer, reference, "oracle"

    def logits(self, ids):
        text = self.tokenizer.decode(ids, clean_up_tokenization_spaces=False)
        out = torch.zeros(len(self.tokenizer))
        rest = self.reference[len(text):] if self.reference.startswith(text) else ""
        nxt = self.tokenizer(rest, add_special_tokens=False)["input_ids"][:1] if rest else [0]
        out[nxt[0]] = 10.0
        return out

    def start(self, prompt_ids, max_positions=None):
        return OracleSession(self), list(prompt_ids)


@pytest.fixture(scope="module")
def target():
    return load_tiny(eos=None, sharp=3.0)


@pytest.fixture(scope="module")
def tokenizers():
    return {"char": byte_bpe(), "bpe": byte_bpe(merges=40)}


# -- the conversion ------------------------------------------------------------------------------

def test_the_draft_tokenizers_end_tokens_mid_word(tokenizers):
    # The premise of the tests below: the drafts' tokens do not line up with the target's words.
    for tok in tokenizers.values():
        assert tok.decode(tok("w12 w3 w45 w0")["input_ids"]) == "w12 w3 w45 w0"
    assert tokenizers["char"].convert_ids_to_tokens(tokenizers["char"]("w12")["input_ids"]) == ["w", "1", "2"]
    pieces = tokenizers["bpe"].convert_ids_to_tokens(tokenizers["bpe"]("w10 w12 w3 w45 w0 w1")["input_ids"])
    assert any("Ġ" in p[1:] for p in pieces)  # a token that runs from one word into the next, e.g. "0Ġw1"


def test_token_text_tracks_partial_characters_and_rollback():
    tok = byte_bpe(all_bytes=True)  # no merges: "é" is two byte tokens
    text = TokenText(tok)
    ids = tok("w1 é w2", add_special_tokens=False)["input_ids"]
    text.extend(ids)
    assert text.text == "w1 é w2"
    mid = next(i for i in range(len(ids)) if not text.is_boundary(i))  # after the first byte of "é"
    assert text.end(mid - 1) == 3
    text.truncate(mid)
    assert text.ids == ids[:mid] and text.text.startswith("w1 ") and not text.is_boundary(mid)
    text.extend(ids[mid:])
    assert text.text == "w1 é w2" and text.is_boundary(len(ids))
    text.sync(tok("w1 é w3 w4", add_special_tokens=False)["input_ids"])
    assert text.text == "w1 é w3 w4"
    assert text.boundary_at_most(len("w1 é w")) == len(tok("w1 é w", add_special_tokens=False)["input_ids"])


def start_drafter(drafter, target, prompt_ids, temperature=0.0, seed=0, gamma_room=64):
    drafter.start(DraftContext(prompt_ids, SamplingParams(temperature=temperature), torch.Generator().manual_seed(seed),
                               target.vocab_size, frozenset(target.eos_token_ids), (), None, torch.device("cpu"),
                               len(prompt_ids) + gamma_room))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_worked_example_only_whole_fixed_target_tokens(target, tokenizers, kind):
    # The draft spells "w1 w2 w3 w45 w6 w78 w9"; from "w1 w2 w3" it proposes whole target words, never
    # the last one it wrote (" w7" could still become " w78"), and at most k of them.
    prompt_ids = target.encode(PROMPT)
    oracle = OracleModel(tokenizers[kind], "w1 w2 w3 w45 w6 w78 w9 w10 w11")
    drafter = RetokenizedDrafter(oracle, target.tokenizer)
    start_drafter(drafter, target, prompt_ids)
    words = [VOCAB.index(w) for w in ("w45", "w6", "w78", "w9")]
    assert drafter.propose(prompt_ids, 2).tokens.tolist() == words[:2]
    assert drafter.propose(prompt_ids, 3).tokens.tolist() == words[:3]
    # The target accepted "w45" and then produced its own "w7": the draft re-reads only the changed text.
    sequence = prompt_ids + [VOCAB.index("w45"), VOCAB.index("w7")]
    oracle.reference = "w1 w2 w3 w45 w7 w8 w9 w10"
    assert drafter.propose(sequence, 2).tokens.tolist() == [VOCAB.index("w8"), VOCAB.index("w9")]
    assert drafter.draft.text.startswith("w1 w2 w3 w45 w7 w8 w9 w")  # (the last draft token may run on: "9 w1")


@pytest.mark.parametrize("kind", ["char", "bpe"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_a_draft_that_knows_the_text_is_always_accepted(target, tokenizers, kind, gamma):
    # Greedy with a draft that spells the target's own greedy text in its tokens: every proposed target
    # token is accepted, most rounds propose gamma of them, and the output is plain decoding's.
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    reference = target.decode(plain.prompt_ids) + " " + plain.text  # the word-level decoder joins words with spaces
    oracle = OracleModel(tokenizers[kind], reference)
    drafter = RetokenizedDrafter(oracle, target.tokenizer)
    out = specdec.generate(target, PROMPT, draft=drafter, gamma=gamma, max_new_tokens=40)
    assert out.token_ids == plain.token_ids
    assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted
    assert out.stats.target_calls <= -(-40 // (gamma + 1)) + 2
    assert out.stats.time_convert > 0


def test_the_draft_cache_rolls_back_to_the_changed_text_only(target, tokenizers):
    # Each round feeds the draft only what it has not seen: about the new text, never the whole sequence.
    plain = specdec.generate(target, PROMPT, max_new_tokens=40)
    reference = target.decode(plain.prompt_ids) + " " + plain.text
    oracle = OracleModel(tokenizers["char"], reference)
    drafter = RetokenizedDrafter(oracle, target.tokenizer)
    fed: list[int] = []
    original = OracleSession.extend

    def counting(self, tokens, n_logits=1):
        fed.append(len(tokens))
        return original(self, tokens, n_logits)

    OracleSession.extend = counting
    try:
        out = specdec.generate(target, PROMPT, draft=drafter, gamma=3, max_new_tokens=40)
    finally:
        OracleSession.extend = original
    assert out.token_ids == plain.token_ids
    prompt_chars = len(target.decode(plain.prompt_ids))
    assert fed[0] == prompt_chars - 1  # the prefill
    assert max(fed[1:]) <= 8  # a round feeds a word or two, never the growing sequence


# -- greedy identity and the target's distribution with real (tiny, random) draft models ----------

@pytest.mark.parametrize("kind", ["char", "bpe"])
@pytest.mark.parametrize("gamma", [1, 2, 5])
def test_greedy_equals_plain_decoding(target, tokenizers, kind, gamma):
    draft = tiny_draft(tokenizers[kind])
    assert isinstance(make_drafter(draft, target), RetokenizedDrafter)
    plain = specdec.generate(target, PROMPT, max_new_tokens=30)
    out = specdec.generate(target, PROMPT, draft=draft, gamma=gamma, max_new_tokens=30)
    assert out.token_ids == plain.token_ids
    assert out.stats.drafted > 0 and out.stats.draft_calls > 0


def test_greedy_with_a_character_level_target_and_a_word_level_draft(tokenizers):
    # The other way round: one draft token ("w45") is several target tokens ("w", "4", "5").
    char = tokenizers["char"]
    char_target = specdec.load(tiny_model(vocab=len(char), seed=2, eos=None, sharp=3.0), tokenizer=char, name="char-target")
    word_draft = load_tiny(seed=6, eos=None, sharp=3.0)
    plain = specdec.generate(char_target, PROMPT, max_new_tokens=30)
    for gamma in (2, 4):
        out = specdec.generate(char_target, PROMPT, draft=word_draft, gamma=gamma, max_new_tokens=30)
        assert out.token_ids == plain.token_ids
        assert max(out.stats.drafted_per_position and [len(out.stats.drafted_per_position)]) >= 2


def test_draft_end_of_sequence_proposes_the_targets(target, tokenizers):
    # A draft that ends its text at once: the proposal is the target's end-of-sequence token.
    eos_target = load_tiny(eos=2, sharp=3.0)
    tok = tokenizers["char"]
    draft_hf = tiny_model(vocab=len(tok), seed=5, eos=2)
    with torch.no_grad():
        draft_hf.lm_head.bias = torch.nn.Parameter(torch.zeros(len(tok)))
        draft_hf.lm_head.bias[2] = 1e4  # "</s>" always
    drafter = make_drafter(specdec.load(draft_hf, tokenizer=tok), eos_target)
    prompt_ids = eos_target.encode(PROMPT)
    start_drafter(drafter, eos_target, prompt_ids)
    assert drafter.propose(prompt_ids, 3).tokens.tolist() == [2]


SMALL_V = 8  # the distribution target: ids 0..7 = <unk> <s> </s> <pad> w0 w1 w2 w3
N_RUNS = 2000  # (each run drafts with a model: kept smaller than test_distribution's 3000)


def test_first_two_tokens_follow_the_target_with_another_tokenizer():
    # Temperature 1, gamma 2, 3 new tokens: the first round drafts 2 target tokens (k = min(2, 3 - 0 - 1)),
    # which the target verifies with a one-hot q; the joint law of the first two generated tokens must be
    # the target's, exactly (chi-square at 1e-3, seeded). The target mostly writes words (its special
    # tokens are pushed down), so the draft's words are accepted often enough to exercise both branches.
    small_target = load_tiny(vocab=SMALL_V, eos=None, sharp=2.0)
    with torch.no_grad():
        small_target.hf_model.lm_head.bias = torch.nn.Parameter(torch.tensor([-2.0] * 4 + [0.0] * 4))
    tok = byte_bpe(words=4, merges=12)  # tokens such as "Ġw2Ġw1" (two words) and "Ġw" (mid-word)
    draft = specdec.load(tiny_model(vocab=len(tok), seed=7, eos=None, sharp=1.0, layers=1, hidden=32), tokenizer=tok)
    probs = exact_joint(small_target, SamplingParams(temperature=1.0))
    counts = torch.zeros(SMALL_V * SMALL_V)
    drafted_two = accepted = 0
    for seed in range(N_RUNS):
        out = specdec.generate(small_target, EXACT_PROMPT, draft=draft, gamma=2, max_new_tokens=3, temperature=1.0,
                               seed=seed)
        x1, x2 = out.token_ids[:2]
        counts[x1 * SMALL_V + x2] += 1
        drafted_two += len(out.stats.drafted_per_position) >= 2
        accepted += out.stats.accepted
    # The first round drafted 2 target tokens in most runs. Not in all: a round proposes only the whole
    # target tokens its draft text fixes, and the draft may stop first (its own end-of-sequence token,
    # or the bound on its steps per round).
    assert drafted_two > 0.8 * N_RUNS
    assert accepted > 0.1 * N_RUNS  # accepted drafts, and (most often) rejected ones
    assert chi_square_pvalue(counts.numpy(), probs.numpy()) > 1e-3


# -- bad input -----------------------------------------------------------------------------------

def test_draft_without_a_tokenizer(target, tokenizers):
    draft = tiny_draft(tokenizers["char"])
    draft.tokenizer = None
    with pytest.raises(SpecDecError, match="the draft 'tiny-draft-16' has no tokenizer"):
        specdec.generate(target, PROMPT, draft=draft)


def test_draft_tokenizer_that_cannot_round_trip_the_text(target):
    # A word-level draft that knows only w0..w9: "w45" becomes "<unk>".
    words = SPECIALS + [f"w{i}" for i in range(10)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    draft = tiny_draft(PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>"))
    out = specdec.generate(target, "w1 w2", draft=draft, max_new_tokens=3)  # a text it can write: fine
    assert len(out.token_ids) == 3
    with pytest.raises(SpecDecError, match="tokenizer of the draft 'tiny-draft-14' cannot round-trip the text.*'w45 w2' into '<unk> w2'"):
        specdec.generate(target, "w1 w45 w2", draft=draft)


def test_a_draft_with_another_tokenizer_is_only_the_last_level_of_a_hierarchy(target, tokenizers):
    other = tiny_draft(tokenizers["char"])
    middle = perturbed(target, 0.3, seed=2)  # the target's tokenizer
    plain = specdec.generate(target, PROMPT, max_new_tokens=30)
    for gamma in (2, 4):
        out = specdec.generate(target, PROMPT, draft=[middle, other], gamma=gamma, max_new_tokens=30)
        assert out.token_ids == plain.token_ids
        assert out.stats.levels[0]["level"] == f"{middle.name}<-{other.name}"
    with pytest.raises(SpecDecError, match="must share the target's tokenizer.*put it last"):
        specdec.generate(target, PROMPT, draft=[other, "prompt-lookup"])


# -- the commands: alpha and bench take such a draft; bench runs transformers' universal assisted generation

def test_alpha_measures_a_draft_with_another_tokenizer(target, tokenizers):
    from specdec.alpha import measure

    plain = specdec.generate(target, PROMPT, max_new_tokens=12)
    reference = target.decode(plain.prompt_ids) + " " + plain.text
    oracle = RetokenizedDrafter(OracleModel(tokenizers["char"], reference), target.tokenizer)
    results, _ = measure(target, {"oracle": oracle, "char": tiny_draft(tokenizers["char"])},
                         [("p", plain.prompt_ids)], [0.0], max_new_tokens=12)
    by = {r["draft"]: r for r in results}
    # teacher-forced, one target token at a time: the oracle is right wherever the text fixes the token
    assert by["oracle"]["alpha"] >= 11 / 12 and by["oracle"]["positions"] == 12
    assert 0.0 <= by["char"]["alpha"] <= 1.0 and by["char"]["coverage"] > 0


def test_bench_runs_transformers_universal_assisted_generation_as_a_peer(target, tokenizers, tmp_path):
    import argparse
    import json

    import specdec.bench as bench

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("w1 w2 w3 w4", "w5 w6 w7")))
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--prompts-file", str(prompts), "--n-prompts", "2", "--max-new-tokens", "10",
                              "--gamma", "3", "--dtype", "fp32"])
    result = bench.run(args, target=target, draft=tiny_draft(tokenizers["bpe"]), progress=False)
    eq = result["equality"]
    assert eq["specdec_spec_vs_plain"]["all_equal"]  # greedy: identical to plain decoding
    assert eq["hf_assisted_vs_hf_plain"]["all_equal"]  # transformers' universal assisted generation, same draft
    assert result["methods"]["hf-assisted"]["new_tokens"] > 0
    assert result["methods"]["specdec-spec"]["drafted"] > 0
    assert result["step_costs"]["c_direct"] > 0  # the draft's step timed on the prompt in its own tokens
    spec = result["methods"]["specdec-spec"]
    assert spec["time_convert_s"] > 0
    # Theorem 8's c for this draft is per target token proposed: its passes per target token, conversion
    row = next(r for r in result["rows"] if r["method"] == "specdec-spec")
    passes = spec["draft_calls"] / spec["drafted"]
    assert row["draft_passes_per_target_token"] == pytest.approx(passes)
    assert row["c"] == pytest.approx(result["step_costs"]["c_direct"] * passes
                                     + spec["time_convert_s"] / spec["drafted"] / result["step_costs"]["target_k1_s"])


def test_cli_takes_a_draft_with_another_tokenizer(target, tokenizers, tmp_path, capsys):
    # --draft FOLDER with another tokenizer: quantized (FOLDER:int8) and
    # not, other schedules, and as the last level of a hierarchy; greedy output equals plain decoding.
    import json

    from specdec import cli

    target_dir, draft_dir, middle_dir = tmp_path / "target", tmp_path / "draft", tmp_path / "middle"
    target.hf_model.save_pretrained(target_dir)
    target.tokenizer.save_pretrained(target_dir)
    draft = tiny_draft(tokenizers["bpe"])
    draft.hf_model.save_pretrained(draft_dir)
    draft.tokenizer.save_pretrained(draft_dir)
    middle = perturbed(target, 0.3, seed=2)
    middle.hf_model.save_pretrained(middle_dir)
    target.tokenizer.save_pretrained(middle_dir)
    plain = specdec.generate(specdec.load(str(target_dir), dtype="fp32"), PROMPT, max_new_tokens=16)
    for extra in ([], ["--gamma-schedule", "heuristic"], ["--gamma", "3", "--draft-quantize", "none"],
                  ["--draft", str(middle_dir)]):
        drafts = (["--draft", str(middle_dir), "--draft", str(draft_dir)] if "--draft" in extra
                  else ["--draft", str(draft_dir) + ("" if extra else ":int8")])
        extra = [] if "--draft" in extra else extra
        code = cli.main(["generate", PROMPT, "--target", str(target_dir), *drafts, "--dtype", "fp32",
                         "--max-new-tokens", "16", "--json", *extra])
        doc = json.loads(capsys.readouterr().out)
        assert code == 0 and doc["token_ids"] == plain.token_ids, extra
        assert doc["stats"]["drafted"] > 0 and doc["stats"]["time_convert_s"] > 0
