"""Tokenizers, corpora, the SCAN grammar and batching."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import torch

from attnlab import ConfigError, DataError, task_config
from attnlab.data.batching import collate_pairs, lm_blocks, lm_eval_blocks, token_budget_batches
from attnlab.data.corpora import FilterReport, filter_by_length, generated_pairs, read_parallel, read_scan, read_tsv
from attnlab.data.scan import scan_commands
from attnlab.data.tokenizers import BOS, EOS, PAD, UNK, Tokenizer

CORPUS = [
    "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    "A little girl climbing into a wooden playhouse.",
    "Ein Mann schläft in einem grünen Raum auf einem Sofa.",
    "Crème brûlée, naïve café — 日本語 text.\tTabs and  double  spaces.",
] * 20


WORD_LEVEL = {"word": str.split, "word_nopunct": lambda text: re.sub(r"[^\w\s]+", " ", text).split()}  # their words


@pytest.mark.parametrize("kind", ["char", "word", "word_nopunct", "bpe", "unigram"])
def test_tokenizers_round_trip_and_keep_special_ids(kind, tmp_path):
    tok = Tokenizer.train(kind, CORPUS, vocab_size=120)
    assert [tok.hf.token_to_id(t) for t in ("<pad>", "<bos>", "<eos>", "<unk>")] == [PAD, BOS, EOS, UNK]
    for text in CORPUS[:4]:
        ids = tok.encode(text)
        assert UNK not in ids
        # the word-level kinds: whitespace separates words, and word_nopunct reads punctuation as a space
        expected = " ".join(WORD_LEVEL[kind](text)) if kind in WORD_LEVEL else text
        assert tok.decode(ids) == expected
        assert tok.decode([BOS] + ids + [EOS, PAD, 7, 8]) == expected  # BOS, and all after EOS, dropped
    path = tmp_path / "tok.json"
    path.write_text(tok.to_str())
    loaded = Tokenizer.load(path)
    assert loaded.hf.get_vocab() == tok.hf.get_vocab()
    assert loaded.encode_batch(CORPUS[:4]) == tok.encode_batch(CORPUS[:4])


@pytest.mark.parametrize("kind", ["char", "word", "unigram"])
def test_unknown_characters_become_unk(kind):
    tok = Tokenizer.train(kind, CORPUS, vocab_size=120)
    ids = tok.encode("Männer ☃")
    assert ids[-1] == UNK and tok.decode(ids).endswith("<unk>")


def test_bpe_falls_back_to_bytes_for_unseen_characters():
    tok = Tokenizer.train("bpe", CORPUS, vocab_size=400)
    text = "Männer sehen ☃ und 🙂"
    ids = tok.encode(text)
    assert UNK not in ids and tok.decode(ids) == text
    assert "<0xE2>" in tok.tokens("☃")  # U+2603 is E2 98 83 in UTF-8


def test_char_tokenizer_keeps_newlines_and_spaces():
    tok = Tokenizer.train("char", ["ab\ncd e"])
    assert tok.tokens("a b\n") == ["a", " ", "b", "\n"]
    assert tok.vocab_size == 4 + 7


def test_bad_tokenizer_file(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="not a tokenizer file"):
        Tokenizer.load(bad)


def test_scan_grammar_meanings():
    commands = dict(scan_commands())
    assert len(commands) == 20910
    assert commands["jump"] == "I_JUMP"
    assert commands["turn left"] == "I_TURN_LEFT"
    assert commands["walk opposite right"] == "I_TURN_RIGHT I_TURN_RIGHT I_WALK"
    assert commands["turn around left"] == " ".join(["I_TURN_LEFT"] * 4)
    assert commands["look around right twice"] == " ".join(["I_TURN_RIGHT I_LOOK"] * 8)
    assert commands["run thrice after jump left"] == "I_TURN_LEFT I_JUMP I_RUN I_RUN I_RUN"
    assert commands["walk and turn opposite left"] == "I_WALK I_TURN_LEFT I_TURN_LEFT"
    # the longest action sequence: 'x around y thrice' twice over, 48 actions
    assert max(len(a.split()) for a in commands.values()) == 48


def test_generated_pairss_are_seeded_and_disjoint():
    a = generated_pairs("reverse", seed=3, n_train=50, n_valid=10, n_test=10)
    assert a == generated_pairs("reverse", seed=3, n_train=50, n_valid=10, n_test=10)
    assert a != generated_pairs("reverse", seed=4, n_train=50, n_valid=10, n_test=10)
    sources = [s for split in a.values() for s, _ in split]
    assert len(sources) == len(set(sources)) == 70
    src, tgt = a["train"][0]
    assert tgt.split() == src.split()[::-1]
    s, t = generated_pairs("sort", 1, 5, 1, 1)["test"][0]
    assert t.split() == sorted(s.split())
    scan = generated_pairs("scan", seed=0, n_train=None, n_valid=100, n_test=200)
    assert (len(scan["train"]), len(scan["valid"]), len(scan["test"])) == (20610, 100, 200)


def test_generated_pairs_are_those_of_release_0_2():
    """The draw of the sequence tasks is pinned: runs and golden files made before stay reproducible."""
    assert generated_pairs("copy", 1, 2, 1, 1, 3, 4) == {
        "train": [("v 1 o", "v 1 o"), ("0 s h e", "0 s h e")],
        "valid": [("s u o d", "s u o d")],
        "test": [("4 g 7", "4 g 7")],
    }


def test_addition_pairs_are_sums_of_numbers_of_the_drawn_length():
    pairs = generated_pairs("addition", seed=2, n_train=300, n_valid=20, n_test=20, min_len=1, max_len=12)
    lengths = set()
    for src, tgt in pairs["train"]:
        a, b = src.split(" + ")
        assert len(a.split()) == len(b.split()) and a[0] != "0" and b[0] != "0"
        assert int(tgt.replace(" ", "")) == int(a.replace(" ", "")) + int(b.replace(" ", ""))
        lengths.add(len(a.split()))
    assert lengths == set(range(1, 13))


@pytest.mark.parametrize("generator", ["copy", "reverse", "sort", "addition"])
def test_the_test_split_can_be_longer_than_training(generator):
    pairs = generated_pairs(
        generator, seed=5, n_train=200, n_valid=30, n_test=100, min_len=1, max_len=20, test_lengths=(21, 80)
    )

    def length(src: str) -> int:
        return len(src.split(" + ")[0].split())

    assert all(1 <= length(s) <= 20 for split in ("train", "valid") for s, _ in pairs[split])
    test_lengths = [length(s) for s, _ in pairs["test"]]
    assert min(test_lengths) >= 21 and max(test_lengths) <= 80 and max(test_lengths) - min(test_lengths) > 40


def test_a_length_range_too_narrow_for_the_pairs_asked_is_one_clear_error():
    with pytest.raises(
        DataError, match=r"data.generator.name 'copy': cannot draw 100 distinct sequences of lengths 1-1"
    ):
        generated_pairs("copy", seed=1, n_train=100, n_valid=1, n_test=1, min_len=1, max_len=1)


def test_test_lengths_are_refused_where_they_cannot_apply():
    with pytest.raises(ConfigError, match=r"test_min_len / test_max_len set the test lengths of a sequence generator"):
        task_config({"task": "translation", "generator": {"name": "scan", "test_max_len": 40}})
    with pytest.raises(ConfigError, match=r"generator.test_max_len \(15\) must be >= generator.test_min_len \(21\)"):
        task_config(
            {
                "task": "translation",
                "generator": {"name": "reverse", "test_min_len": 21, "test_max_len": 15},
                "n_train": 10,
            }
        )
    assert task_config(
        {"task": "translation", "generator": {"name": "reverse", "max_len": 20, "test_max_len": 40}, "n_train": 10}
    ).generator.test_lengths == (3, 40)  # test_min_len defaults to min_len


@pytest.mark.parametrize("generator", ["copy", "reverse", "sort", "addition"])
def test_a_drawing_generator_without_n_train_is_refused_when_the_config_is_read(generator):
    """Without n_train a sequence generator drew no training pairs, and training failed later with
    "no training pairs left after length filtering (kept all 0 pairs)" (issue 64)."""
    with pytest.raises(ConfigError, match=rf"^generator '{generator}' draws its pairs: set n_train, how many"):
        task_config({"task": "translation", "generator": {"name": generator}})
    assert (
        task_config({"task": "translation", "generator": {"name": "scan"}}).splits.n_train is None
    )  # SCAN's grammar gives its pairs


def test_the_translation_task_reads_its_test_split_at_the_test_lengths():
    from attnlab.tasks.translation import read_pairs

    cfg = task_config(
        {
            "task": "translation",
            "generator": {"name": "copy", "min_len": 1, "max_len": 5, "test_min_len": 30, "test_max_len": 30},
            "n_train": 10,
            "n_valid": 2,
            "n_test": 3,
        }
    )
    pairs = read_pairs(cfg)
    assert [len(s.split()) for s, _ in pairs["test"]] == [30, 30, 30]
    assert all(len(s.split()) <= 5 for s, _ in pairs["train"] + pairs["valid"])


def test_readers_name_file_and_line(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    with pytest.raises(DataError, match=r"a.de has 2 lines but .*a.en has 3"):
        read_parallel(tmp_path / "a.de", tmp_path / "a.en")
    (tmp_path / "b.tsv").write_text("eins\tone\nzwei two\n")
    with pytest.raises(DataError, match=r"b.tsv:2: expected 2 tab-separated fields"):
        read_tsv(tmp_path / "b.tsv")
    (tmp_path / "c.txt").write_text("IN: jump OUT: I_JUMP\nwalk I_WALK\n")
    with pytest.raises(DataError, match=r"c.txt:2: expected 'IN: <command> OUT: <actions>'"):
        read_scan(tmp_path / "c.txt")
    (tmp_path / "d.txt").write_bytes(b"ok\n\xff\xfe bad\n")
    with pytest.raises(DataError, match=r"d.txt:2: not valid UTF-8"):
        read_tsv(tmp_path / "d.txt")
    with pytest.raises(DataError, match="no such file"):
        read_tsv(tmp_path / "missing.tsv")
    (tmp_path / "e.tsv").write_text("")
    with pytest.raises(DataError, match="file is empty"):
        read_tsv(tmp_path / "e.tsv")


def test_lines_split_at_newlines_only(tmp_path):
    (tmp_path / "p.de").write_bytes("\ufeffeins\u2028a\r\nzwei\x85b\n".encode())
    (tmp_path / "p.en").write_text("one\ntwo\x0cc\n")
    assert read_parallel(tmp_path / "p.de", tmp_path / "p.en") == [("eins\u2028a", "one"), ("zwei\x85b", "two\x0cc")]


def test_word_nopunct_reads_the_same_words_whatever_punctuation_follows_them():
    """Issue 64: with ``word``, 'triangle?' is a word of its own, so a question asked without its
    question mark reads an unknown word; ``word_nopunct`` reads 'triangle' either way, the same ids."""
    questions = ["what colour is the triangle?", "how many circles?", "what shape is the red object?"] * 3
    word, bare = Tokenizer.train("word", questions), Tokenizer.train("word_nopunct", questions)
    assert word.tokens("what colour is the triangle") == ["what", "colour", "is", "the", "<unk>"]  # only 'triangle?'
    assert word.encode("what colour is the triangle")[-1] == UNK
    assert bare.tokens("what colour is the triangle?") == ["what", "colour", "is", "the", "triangle"]
    ids = bare.encode("what colour is the triangle")
    assert UNK not in ids and all(
        bare.encode(q) == ids
        for q in ("what colour is the triangle?", "what colour, is the triangle ?!", "what colour is the triangle.")
    )
    assert sorted(bare.hf.get_vocab()) == sorted(
        [
            "<pad>",
            "<bos>",
            "<eos>",
            "<unk>",
            "what",
            "colour",
            "is",
            "the",
            "triangle",
            "how",
            "many",
            "circles",
            "shape",
            "red",
            "object",
        ]
    )


TYPED_SPECIALS = "walk <pad> left <bos> jump <eos> twice <unk>"


@pytest.mark.parametrize("kind", ["char", "word", "bpe", "unigram"])
def test_special_token_strings_in_text_are_text(kind):
    """Typed '<eos>' must not end the sentence, nor '<pad>' be read as padding: the control ids
    never come out of text. Subword and character kinds spell them out; to the word kind they are
    unknown words."""
    tok = Tokenizer.train(kind, ["walk left <> bos eos pad unk jump twice"] * 5 + CORPUS, vocab_size=300)
    ids = tok.encode(TYPED_SPECIALS)
    assert not {PAD, BOS, EOS} & set(ids)
    assert tok.encode_batch([TYPED_SPECIALS]) == [ids]
    if kind == "word":
        assert tok.decode(ids) == "walk <unk> left <unk> jump <unk> twice <unk>" and ids.count(UNK) == 4
    else:
        assert UNK not in ids and tok.decode(ids) == TYPED_SPECIALS


def test_a_unigram_tokenizer_saved_before_the_fix_still_encodes_specials_as_unknown():
    """Unigram files written before the special pieces were made unreachable score them 0 (the
    best); a loaded one never returns a control id all the same."""
    spec = json.loads(Tokenizer.train("unigram", CORPUS, vocab_size=120).to_str())
    for entry in spec["model"]["vocab"][:4]:
        entry[1] = 0.0
    old = Tokenizer.from_str(json.dumps(spec))
    ids = old.encode("<pad> <eos>")
    assert not {PAD, BOS, EOS} & set(ids) and ids.count(UNK) == 2


def test_training_text_may_not_use_the_special_tokens_as_words():
    with pytest.raises(DataError, match="uses the special token <unk> as a word"):
        Tokenizer.train("word", ["the <unk> sat", "a <unk> ran"])
    with pytest.raises(DataError, match="cannot train the unigram tokenizer"):
        Tokenizer.train("unigram", ["abc def ghi jkl mno pqr"] * 5, vocab_size=5)


def test_length_filter_reports_why():
    pairs = [([1, 2], [3]), ([], [3]), ([1] * 9, [3]), ([1], [3] * 7), ([1], [2])]
    keep, report = filter_by_length(pairs, max_src_len=8, max_tgt_len=6)
    assert keep == [0, 4]
    assert dict(report.dropped) == {
        "with an empty side": 1,
        "with source over 8 tokens": 1,
        "with target over 6 tokens": 1,
    }
    assert str(report) == (
        "kept 2 pairs, dropped 3 (1 with an empty side, 1 with source over 8 tokens, 1 with target over 6 tokens)"
    )
    assert str(FilterReport(kept=18410)) == "kept all 18,410 pairs"  # as the split sizes beside it: train 18,410
    assert (
        str(FilterReport(28_999, Counter({"with source over 100 tokens": 1_203})))
        == "kept 28,999 pairs, dropped 1,203 (1,203 with source over 100 tokens)"
    )


def test_collate_shifts_targets_for_teacher_forcing():
    batch = collate_pairs([([5, 6, 7], [8, 9]), ([5], [8, 9, 10])])
    assert batch.src.tolist() == [[5, 6, 7, EOS], [5, EOS, PAD, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 8, 9, PAD], [BOS, 8, 9, 10]]
    assert batch.tgt_out.tolist() == [[8, 9, EOS, PAD], [8, 9, 10, EOS]]
    assert batch.n_targets == 7


def test_token_budget_batches():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (500,), generator=g).tolist()
    batches = token_budget_batches(lengths, max_tokens=200, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b) == list(range(500))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 200
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in batches)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:]))  # bucketed: no interleaving
    assert batches == token_budget_batches(lengths, 200, seed=1, epoch=0)
    assert batches != token_budget_batches(lengths, 200, seed=1, epoch=1)
    assert token_budget_batches([300, 5], max_tokens=200, seed=0, epoch=0) in ([[1], [0]], [[0], [1]])


def test_lm_blocks_shift_by_one():
    data = torch.arange(100)
    batch = lm_blocks(data, block_size=8, batch_size=4, generator=torch.Generator().manual_seed(0))
    assert batch.src is None and batch.tgt_in.shape == (4, 8)
    assert torch.equal(batch.tgt_out, batch.tgt_in + 1)  # the stream counts up, so next = this + 1
    blocks = lm_eval_blocks(data, block_size=8, batch_size=5)
    assert sum(b.tgt_in.shape[0] for b in blocks) == 12
    assert blocks[0].tgt_in[1].tolist() == list(range(8, 16)) and blocks[0].tgt_out[1, -1] == 16


def test_n_train_keeps_the_first_training_pairs_of_a_file(tmp_path):
    from attnlab.tasks.translation import read_pairs

    (tmp_path / "train.tsv").write_text("".join(f"a{i}\tb{i}\n" for i in range(10)))
    cfg = task_config(
        {"task": "translation", "format": "tsv", "train": str(tmp_path / "train.tsv"), "n_valid": 3, "n_train": 4}
    )
    pairs = read_pairs(cfg)
    assert pairs["valid"] == [(f"a{i}", f"b{i}") for i in (7, 8, 9)]  # held out first, from the end
    assert pairs["train"] == [(f"a{i}", f"b{i}") for i in range(4)]
