"""The masked-LM task: BERT's masking (proportions, specials, whole words, reproducibility), the
<mask> token, and an encoder pre-trained and queried with fill-mask through the command line."""

from __future__ import annotations

import json
import random

import pytest
import torch

from attnlab.data.tokenizers import BOS, EOS, MASK, PAD, UNK, Tokenizer
from attnlab.tasks import Batching
from attnlab.tasks.masked_lm import N_SPECIALS, MaskedLMConfig, mask_tokens
from attnlab.tasks.parts import Files, Splits

from helpers import run_cli


def sample(rows: int = 400, length: int = 250, seed: int = 0):
    """(rows, length) ids: <bos>, words 5..999, <eos>, then padding of random length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(N_SPECIALS, 1000, (rows, length), generator=g)
    ids[:, 0] = BOS
    ends = torch.randint(length // 2, length, (rows,), generator=g)
    for r, end in enumerate(ends.tolist()):
        ids[r, end] = EOS
        ids[r, end + 1 :] = PAD
    return ids


def test_bert_masking_proportions_on_a_large_sample():
    ids = sample()
    cfg = MaskedLMConfig(files=Files(train="x"))
    batch = mask_tokens(ids, torch.ones_like(ids, dtype=torch.bool), cfg, 1000, torch.Generator().manual_seed(1))
    words = (ids != PAD) & (ids != BOS) & (ids != EOS)
    chosen = batch.targets != PAD
    assert not (chosen & ~words).any()  # <pad>, <bos> and <eos> are never chosen
    assert torch.equal(batch.targets[chosen], ids[chosen]) and torch.equal(batch.inputs[~chosen], ids[~chosen])
    n = int(chosen.sum())
    assert n / int(words.sum()) == pytest.approx(0.15, abs=0.005)  # about 70,000 tokens: sd 0.0014
    masked = batch.inputs[chosen] == MASK
    kept = batch.inputs[chosen] == ids[chosen]
    replaced = ~masked & ~kept
    assert masked.float().mean().item() == pytest.approx(0.8, abs=0.01)
    assert kept.float().mean().item() == pytest.approx(0.1, abs=0.01)  # a random token equal to the original: 0.1%
    assert replaced.float().mean().item() == pytest.approx(0.1, abs=0.01)
    assert (batch.inputs[chosen][replaced] >= N_SPECIALS).all()  # never a special token
    assert batch.n_targets == n


def test_whole_word_masking_chooses_every_piece_of_a_word_together():
    ids = sample(rows=50, length=60)
    g = torch.Generator().manual_seed(2)
    starts = torch.rand(ids.shape, generator=g) < 0.4  # words of about 2.5 pieces
    starts[:, 0] = True
    cfg = MaskedLMConfig(files=Files(train="x"), whole_word=True, mask_prob=0.3)
    batch = mask_tokens(ids, starts, cfg, 1000, torch.Generator().manual_seed(3))
    chosen = (batch.targets != PAD).tolist()
    words = ((ids != PAD) & (ids != BOS) & (ids != EOS)).tolist()
    n_words = n_chosen_words = 0
    for r in range(ids.shape[0]):
        t = 1
        while t < ids.shape[1] and words[r][t]:
            end = t + 1
            while end < ids.shape[1] and words[r][end] and not starts[r, end]:
                end += 1
            assert len(set(chosen[r][t:end])) == 1, (r, t, end)  # all or none of the word
            n_words, n_chosen_words = n_words + 1, n_chosen_words + chosen[r][t]
            t = end
    assert n_chosen_words / n_words == pytest.approx(0.3, abs=0.03)


def test_a_masked_lm_tokenizer_has_mask_at_id_4_and_text_never_encodes_to_it():
    tok = Tokenizer.train("word", ["the film was good", "the plot was thin"], with_mask=True)
    assert tok.id_tokens([MASK]) == ["<mask>"] and tok.has_mask
    assert tok.encode("the <mask> was good") == [tok.encode("the")[0], UNK, *tok.encode("was good")]
    plain = Tokenizer.train("word", ["the film was good"])
    assert not plain.has_mask and plain.id_tokens([4]) != ["<mask>"]


def test_training_batches_are_masked_the_same_for_the_same_epoch(tmp_path):
    (tmp_path / "t.txt").write_text("".join(f"line {i} of some text\n" for i in range(40)))
    cfg = MaskedLMConfig(files=Files(train=str(tmp_path / "t.txt")), splits=Splits(n_valid=5), whole_word=True)
    data = cfg.task.prepare(Batching(max_tokens=64, batch_size=8, seed=5))
    again = cfg.task.prepare(Batching(max_tokens=64, batch_size=8, seed=5))
    for a, b in zip(data.epoch_batches(3), again.epoch_batches(3)):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert any(not torch.equal(a.targets, b.targets) for a, b in zip(data.epoch_batches(0), data.epoch_batches(1)))


WORDS = "zero one two three four five six seven eight nine ten eleven".split()

CONFIG = """\
model: {{arch: encoder_only, stack: {{d_model: 32, n_heads: 2, n_layers: 2, d_ff: 64, dropout: 0.0}}, positions: {{scheme: learned,
        max_len: 16}}}}
data: {{task: masked_lm, train: {train}, max_len: 16, splits: {{n_valid: 100}}, mask_prob: 0.2}}
train: {{max_steps: 300, max_tokens: 512, lr_schedule: constant, lr: 3.0e-3, warmup_steps: 1, eval_every: 150,
        log_every: 50, label_smoothing: 0.0, progress: false, early_stop_metric: masked_accuracy}}
"""


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """Runs of six consecutive words from a cycle of twelve: a masked word follows from its neighbours."""
    root = tmp_path_factory.mktemp("mlm")
    rng = random.Random(0)
    lines = []
    for _ in range(600):
        start = rng.randrange(12)
        lines.append(" ".join(WORDS[(start + i) % 12] for i in range(6)) + "\n")
    (root / "counting.txt").write_text("".join(lines))
    (root / "c.yaml").write_text(CONFIG.format(train=root / "counting.txt"))
    done = run_cli("train", str(root / "c.yaml"), "--out", str(root / "run"))
    assert done.returncode == 0, done.stderr
    return root, done


def test_an_encoder_learns_masked_words_through_the_command_line(pretrained):
    root, done = pretrained
    assert "masked-LM text: train 500 lines, valid 100 lines; vocabulary 17;" in done.stdout
    valid = [
        json.loads(line)
        for line in (root / "run" / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["split"] == "valid"
    ]
    assert [v["step"] for v in valid] == [150, 300]
    assert valid[-1]["masked_accuracy"] > 0.8 and valid[-1]["valid_ppl"] < 1.5  # a guess among 12 words: 1/12, ppl 12


def test_fill_mask_prints_the_likely_words(pretrained):
    root, _ = pretrained
    done = run_cli("fill-mask", str(root / "run"), "three four [MASK] six seven eight", "--top-k", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("[MASK] 1: five (0.")
    fillers = json.loads(run_cli("fill-mask", str(root / "run"), "[MASK] one two [MASK] four five", "--json").stdout)
    assert [row[0]["token"] for row in fillers] == ["zero", "three"]
    assert all(len(row) == 5 and row[0]["probability"] >= row[1]["probability"] for row in fillers)
    refused = run_cli("fill-mask", str(root / "run"), "three four five")
    assert refused.returncode == 4 and refused.stderr == "error: the text has no [MASK] to fill: 'three four five'\n"
    refused = run_cli("predict", str(root / "run"), stdin="three\n")
    assert refused.returncode == 2 and "`attnlab predict` needs data.task 'classification'" in refused.stderr


def test_without_a_valid_file_the_last_training_lines_are_held_out(tmp_path):
    from attnlab.errors import DataError
    from attnlab.tasks.batching import hold_out_valid

    split = hold_out_valid({"train": [1, 2, 3, 4], "test": [9]}, 1, "t.txt", "lines")
    assert list(split.items()) == [("train", [1, 2, 3]), ("test", [9]), ("valid", [4])]
    assert hold_out_valid({"train": [1, 2], "valid": [3]}, 5, "t.txt", "lines") == {"train": [1, 2], "valid": [3]}
    (tmp_path / "t.txt").write_text("one two\nthree four\n")
    with pytest.raises(DataError) as err:
        MaskedLMConfig(files=Files(train=str(tmp_path / "t.txt")), splits=Splits(n_valid=2)).task.prepare(
            Batching(64, 8, 0)
        )
    assert str(err.value) == (
        f"{tmp_path / 't.txt'}: 2 lines are too few to hold out splits.n_valid (2) for validation; give a 'valid' file"
    )
