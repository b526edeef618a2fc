"""Mask-Predict (Ghazvininejad et al. 2019): the cmlm family, the masked_translation task's masks
and loss, and mask-predict decoding against oracles worked out by hand."""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab import FAMILIES
from attnlab.data.tokenizers import BOS, EOS, MASK, PAD
from attnlab.decode.mask_predict import NEVER_OUTPUT, mask_predict, masks_at
from attnlab.errors import ConfigError
from attnlab.runs.checkpoint import load_run
from attnlab.tasks import Batching, Translation
from attnlab.tasks.masked_translation import MaskedBatch, MaskedTranslation, MaskedTranslationConfig, mask_targets
from attnlab.tasks.pairs_section import PairGenerator
from attnlab.tasks.parts import Splits

from helpers import run_cli, sized, tiny_model

W5, W6, V = 5, 6, 7  # two words after the five specials (pad bos eos unk mask)


class StubCMLM(nn.Module):
    """A conditional masked LM whose token distributions are fixed tables of the number k of
    <mask> tokens in its input row: ``tables[k]`` gives position i's probabilities over the V ids.
    Its length distribution is ``length_probs`` (column j: length j + 1), for every source."""

    def __init__(self, tables: dict[int, list[dict[int, float]]], length_probs: list[float]) -> None:
        super().__init__()
        self.tables = {k: torch.log(torch.tensor([distribution(p) for p in rows])) for k, rows in tables.items()}
        self.length_probs = torch.tensor(length_probs)

    def encode(self, src):
        return torch.zeros(*src.shape, 1), src != PAD

    def length_predictor(self, memory, valid):
        return self.length_probs.log().expand(memory.shape[0], -1)

    def decode(self, tgt, memory, valid):
        rows = [self.tables.get(n, torch.zeros(0, V)) for n in (tgt == MASK).sum(1).tolist()]
        return torch.stack([F.pad(r, (0, 0, 0, tgt.shape[1] - len(r)))[: tgt.shape[1]] for r in rows])  # (B, T, V)


def distribution(p: dict[int, float]) -> list[float]:
    """The given probabilities, the rest spread over the unnamed ids."""
    rest = [i for i in range(V) if i not in p]
    return [p.get(i, (1 - sum(p.values())) / len(rest)) for i in range(V)]


# The worked example: N = 3. With every position masked the model says 5 (.9), 6 (.5), 5 (.6);
# with two masks, position 1 is 5 (.7) and position 2 is 6 (.8); with one, position 1 is 6 (.95).
TABLES = {
    3: [{W5: 0.9}, {W6: 0.5, W5: 0.4}, {W5: 0.6}],
    2: [{W5: 0.9}, {W5: 0.7}, {W6: 0.8}],
    1: [{W5: 0.9}, {W6: 0.95}, {W6: 0.8}],
}


def test_the_masking_schedule_is_n_equals_n_times_t_minus_t_over_t():
    lengths = torch.tensor([10, 3, 1])
    assert [masks_at(lengths, t, 4).tolist() for t in range(4)] == [[10, 3, 1], [7, 2, 0], [5, 1, 0], [2, 0, 0]]
    assert masks_at(torch.tensor([7]), 1, 10).tolist() == [6]  # floor(7 * 9 / 10)


@pytest.mark.parametrize(
    "iterations,tokens,probs",
    [
        # t = 0: 5 6 5 (.9 .5 .6). t = 1 of 3: n = 2, positions 1 and 2 re-masked -> 5 (.7), 6 (.8);
        # t = 2: n = 1, position 1 (.7) -> 6 (.95)
        (3, [W5, W6, W6], [0.9, 0.95, 0.8]),
        # t = 1 of 2: n = floor(3 / 2) = 1, position 1 (.5) re-masked -> 6 (.95); position 2 keeps 5 (.6)
        (2, [W5, W6, W5], [0.9, 0.95, 0.6]),
        (1, [W5, W6, W5], [0.9, 0.5, 0.6]),
    ],
)
def test_mask_predict_against_a_hand_worked_oracle(iterations, tokens, probs):
    model = StubCMLM(TABLES, [0.1, 0.2, 0.7])
    [(ids, score)] = mask_predict(model, torch.tensor([[8, EOS]]), iterations, length_beam=1)
    assert ids == tokens
    assert score == pytest.approx(sum(map(math.log, probs)) / 3, abs=1e-6)


def test_pad_bos_eos_and_mask_are_never_output():
    specials = {PAD: 0.2, BOS: 0.2, EOS: 0.2, MASK: 0.2}
    model = StubCMLM({2: [specials | {W6: 0.15}, specials | {W5: 0.15}]}, [0.1, 0.9])
    [(ids, score)] = mask_predict(model, torch.tensor([[8, EOS]]), 1, length_beam=1)
    assert ids == [W6, W5] and set(NEVER_OUTPUT) == {PAD, BOS, EOS, MASK}
    assert score == pytest.approx(math.log(0.15), abs=1e-6)  # the model's own probability of the word


def test_the_length_beam_keeps_the_candidate_of_highest_mean_log_probability():
    # length 2 is the likelier length, but its tokens are less sure (.4, .4) than length 3's (.9, .9, .9)
    model = StubCMLM({2: [{W5: 0.4}, {W6: 0.4}], 3: [{W6: 0.9}, {W6: 0.9}, {W5: 0.9}]}, [0.1, 0.5, 0.4])
    assert mask_predict(model, torch.tensor([[8, EOS]]), 1, length_beam=1)[0][0] == [W5, W6]
    [(ids, score)] = mask_predict(model, torch.tensor([[8, EOS]]), 1, length_beam=2)
    assert ids == [W6, W6, W5] and score == pytest.approx(math.log(0.9), abs=1e-6)
    # a beam wider than the lengths there are takes them all
    assert mask_predict(model, torch.tensor([[8, EOS]]), 1, length_beam=9)[0][0] == [W6, W6, W5]


@torch.no_grad()
def reference_mask_predict(model, src, iterations, length_beam):
    """Mask-predict written plainly for one (1, S) source: each candidate alone, a loop per step."""
    memory, valid = model.encode(src)
    candidates = []
    for length in (model.length_predictor(memory, valid)[0].topk(length_beam).indices + 1).tolist():
        tokens, logp = [MASK] * length, [0.0] * length
        for t in range(iterations):
            n = length if t == 0 else length * (iterations - t) // iterations
            remask = sorted(range(length), key=lambda i: (logp[i], i))[:n]
            for i in remask:
                tokens[i] = MASK
            log_probs = model.decode(torch.tensor([tokens]), memory, valid)[0].log_softmax(-1)
            for i in remask:
                allowed = [(log_probs[i, w].item(), -w) for w in range(log_probs.shape[1]) if w not in NEVER_OUTPUT]
                best, w = max(allowed)
                tokens[i], logp[i] = -w, best
        candidates.append((sum(logp) / length, tokens))
    score, tokens = max(candidates, key=lambda c: c[0])
    return tokens, score


def briefly_trained_cmlm() -> nn.Module:
    """A tiny cmlm after 40 steps of copying: an untrained one predicts one token everywhere."""
    model = tiny_model(arch="cmlm", max_target_length=7).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        tgt = torch.randint(5, 23, (16, 5), generator=g)
        inputs, targets = mask_targets(tgt, g)
        batch = MaskedBatch(F.pad(tgt, (0, 1), value=EOS), inputs, targets, torch.full((16,), 5))
        loss, _ = MaskedTranslationConfig().task.loss(model, batch, 0.0, contextlib.nullcontext)
        optimizer.zero_grad()
        (loss / batch.n_targets).backward()
        optimizer.step()
    return model.eval()


@pytest.mark.parametrize("iterations,length_beam", [(4, 3), (2, 2)])
def test_batched_sentences_and_candidates_equal_the_plain_reference(iterations, length_beam):
    model = briefly_trained_cmlm()
    sources = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]
    src = torch.tensor([s + [EOS] + [PAD] * (5 - len(s)) for s in sources])
    batched = mask_predict(model, src, iterations, length_beam)
    for s, (ids, score) in zip(sources, batched):
        ref_ids, ref_score = reference_mask_predict(model, torch.tensor([s + [EOS]]), iterations, length_beam)
        assert ids == ref_ids and score == pytest.approx(ref_score, abs=1e-5)
    assert len({token for ids, _ in batched for token in ids}) > 2  # not one token everywhere


@torch.no_grad()
def test_one_iteration_is_the_argmax_of_one_parallel_pass():
    model = tiny_model(arch="cmlm", max_target_length=7)
    src = torch.tensor([[5, 6, 7, EOS]])
    memory, valid = model.encode(src)
    length = int(model.length_predictor(memory, valid).argmax()) + 1
    log_probs = model.decode(torch.full((1, length), MASK), memory, valid)[0].log_softmax(-1)
    log_probs[:, list(NEVER_OUTPUT)] = -math.inf
    [(ids, score)] = mask_predict(model, src, iterations=1, length_beam=1)
    assert ids == log_probs.argmax(-1).tolist()
    assert score == pytest.approx(log_probs.max(-1).values.mean().item(), abs=1e-6)


@torch.no_grad()
def test_the_decoder_sees_later_positions_and_never_padding():
    model = tiny_model(arch="cmlm")
    src = torch.tensor([[5, 6, 7, EOS]])
    memory, valid = model.encode(src)
    tgt = torch.tensor([[8, MASK, 9, 10]])
    logits = model.decode(tgt, memory, valid)
    changed = model.decode(torch.tensor([[8, MASK, 9, 11]]), memory, valid)
    assert (logits[0, 0] - changed[0, 0]).abs().max() > 1e-4  # position 0 reads position 3
    padded = model.decode(torch.tensor([[8, MASK, 9, 10, PAD, PAD]]), memory, valid)
    torch.testing.assert_close(padded[:, :4], logits, atol=1e-5, rtol=0)
    causal = tiny_model(arch="encoder_decoder")  # the same parts, causal: position 0 does not read position 3
    m, v = causal.encode(src)
    torch.testing.assert_close(
        causal.decode(tgt, m, v)[0, 0], causal.decode(torch.tensor([[8, MASK, 9, 11]]), m, v)[0, 0]
    )


def test_training_masks_draw_n_uniformly_from_one_to_n_and_follow_the_seed():
    tgt = torch.tensor([[5, 6, 7, 8], [9, 10, PAD, PAD]])
    counts = {0: [], 1: []}
    for seed in range(400):
        inputs, targets = mask_targets(tgt, torch.Generator().manual_seed(seed))
        masked = inputs == MASK
        assert torch.equal(masked, targets != PAD)  # the loss's targets are exactly the masked tokens
        assert torch.equal(torch.where(masked, targets, inputs), tgt)  # the others are kept, padding untouched
        for row in counts:
            counts[row].append(int(masked[row].sum()))
    assert sorted(set(counts[0])) == [1, 2, 3, 4] and sorted(set(counts[1])) == [1, 2]
    assert min(counts[0].count(n) for n in range(1, 5)) > 60  # about 100 each of 400
    again = mask_targets(tgt, torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(again, mask_targets(tgt, torch.Generator().manual_seed(7))))


def test_the_task_batches_copy_pairs_with_masks_from_the_batch_seed():
    cfg = MaskedTranslationConfig(
        generator=PairGenerator("copy"), splits=Splits(seed=1234, n_train=60, n_valid=10, n_test=10)
    )
    data = cfg.task.prepare(Batching(max_tokens=120, batch_size=8, seed=3))
    assert data.tokenizers["tgt"].has_mask and data.tokenizers["src"].has_mask
    first, again, other = data.epoch_batches(0), data.epoch_batches(0), data.epoch_batches(1)
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(first, again))
    assert any(
        not torch.equal(a.targets, b.targets) for a, b in zip(first, other) if a.targets.shape == b.targets.shape
    )
    batch = first[0]
    assert torch.equal(batch.lengths, (batch.inputs != PAD).sum(1)) and (batch.src[:, 0] != PAD).all()
    assert batch.n_targets == int((batch.inputs == MASK).sum())


def test_the_loss_is_the_masked_tokens_cross_entropy_plus_the_weighted_length_loss():
    model = tiny_model(arch="cmlm", max_target_length=3, length_loss_weight=0.25).train()
    src = torch.tensor([[5, 6, EOS], [7, EOS, PAD]])
    tgt = torch.tensor([[8, 9, 10, 11], [12, 13, PAD, PAD]])  # the first is longer than max_target_length
    inputs, targets = mask_targets(tgt, torch.Generator().manual_seed(0))
    batch = MaskedBatch(src, inputs, targets, torch.tensor([4, 2]))
    torch.manual_seed(1)  # dropout 0 in tiny models: the two forwards agree
    loss, nll = MaskedTranslationConfig().task.loss(model, batch, 0.1, contextlib.nullcontext)
    logits, length_logits = model(src, inputs)
    masked = targets != PAD
    tokens = F.cross_entropy(logits[masked], targets[masked], label_smoothing=0.1, reduction="sum")
    lengths = -(length_logits.log_softmax(-1)[0, 2] + length_logits.log_softmax(-1)[1, 1])  # lengths 3 (4 clamped), 2
    assert loss.item() == pytest.approx((tokens + 0.25 * lengths).item(), rel=1e-5)
    assert nll.item() == pytest.approx(
        F.cross_entropy(logits[masked], targets[masked], reduction="sum").item(), rel=1e-5
    )
    assert batch.n_targets == int(masked.sum())


def test_the_family_and_task_find_each_other_and_refuse_the_others():
    cmlm = FAMILIES["cmlm"].capabilities
    assert MaskedTranslation.fits(cmlm) and not Translation.fits(cmlm)
    assert not MaskedTranslation.fits(FAMILIES["encoder_decoder"].capabilities)
    with pytest.raises(ConfigError, match=r"max_target_length must be >= 1 \(got 0\)"):
        sized(arch="cmlm", vocab_size=10, max_target_length=0)
    with pytest.raises(ConfigError, match=r"max_target_length \(300\) must be within max_len \(64\)"):
        sized(arch="cmlm", vocab_size=10, positions=dict(scheme="learned", max_len=64), max_target_length=300)


NUMBERS_DE = "null eins zwei drei vier fünf sechs sieben acht neun".split()
NUMBERS_EN = "zero one two three four five six seven eight nine".split()


def tiny_cmlm_config(tmp_path):
    """Numbers as German and English words, and a cmlm config that learns them in 200 steps."""
    de, en = NUMBERS_DE, NUMBERS_EN
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(10, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist() for _ in range(200)]
    for split, chunk in (("train", rows[:180]), ("val", rows[180:])):
        (tmp_path / f"{split}.de").write_text("".join(" ".join(de[i] for i in r) + "\n" for r in chunk))
        (tmp_path / f"{split}.en").write_text("".join(" ".join(en[i] for i in r) + "\n" for r in chunk))
    config = tmp_path / "cmlm.yaml"
    config.write_text(f"""\
model: {{arch: cmlm, stack: {{d_model: 32, n_heads: 2, n_layers: 1, d_ff: 64, dropout: 0.0}}, max_target_length: 8}}
data: {{task: masked_translation, format: parallel, train: {tmp_path}/train, valid: {tmp_path}/val,
       pairs: {{src_lang: de, tgt_lang: en}}, text: {{tokenizer: word}}}}
train: {{max_steps: 200, max_tokens: 300, lr_schedule: constant, lr: 0.003, warmup_steps: 5, eval_every: 200,
        eval_exact_match: 5, log_every: 50, progress: false}}
""")
    return config


def test_train_translate_and_evaluate_a_cmlm_run_from_the_command_line(tmp_path):
    """Each translation is what the plain reference above decodes with the run's model, in English
    number words, and a blank line stays blank. Which words a 200-step model of this size writes
    depends on the CPU's rounding: earlier machines wrote "nine nine eight" for "neun neun acht", a
    2-core AVX-512 EPYC "nine eight eight"; there, 12 of 31 runs of this config and of variants of it
    (other seeds, more steps or data, a wider model, a heavier length loss) wrote all three lines
    word for word. So the words are checked against the reference on the same weights, and the
    learning by the validation loss: 0.10-0.60 over 14 of those runs, where a uniform guess over the
    ten words alone costs ln 10 = 2.30."""
    out = tmp_path / "run"
    done = run_cli("train", str(tiny_cmlm_config(tmp_path)), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "summary.json").read_text())["last_eval"]["valid_loss"] < 1.0
    lines = "drei eins\nnull\n\nneun neun acht\n"
    translated = run_cli("translate", str(out), "--iterations", "2", "--length-beam", "2", stdin=lines)
    assert translated.returncode == 0, translated.stderr
    written = translated.stdout.splitlines()
    assert len(written) == 4 and written[2] == ""
    assert set(" ".join(written).split()) <= set(NUMBERS_EN)
    model, tokenizers, _ = load_run(out)
    for line in ("drei eins", "null", "neun neun acht"):
        ids, _ = reference_mask_predict(model, torch.tensor([tokenizers["src"].encode(line) + [EOS]]), 2, 2)
        assert tokenizers["tgt"].decode(ids) == written[lines.splitlines().index(line)]
    evaluated = run_cli(
        "evaluate",
        str(out),
        "--src",
        str(tmp_path / "val.de"),
        "--ref",
        str(tmp_path / "val.en"),
        "--iterations",
        "1",
        "--length-beam",
        "1",
    )
    assert evaluated.returncode == 0, evaluated.stderr
    assert (
        evaluated.stdout.startswith("BLEU ")
        and "(20 sentences, mask-predict: 1 iterations, length beam 1)" in evaluated.stdout
    )


@pytest.mark.parametrize(
    "run,args,message",
    [
        ("cmlm", ["--iterations", "0"], "--iterations must be between 1 and 1000 (got 0)"),
        (
            "cmlm",
            ["--beam", "2"],
            "--beam is for left-to-right search; RUN holds arch 'cmlm', decoded by mask-predict: give --iterations and --length-beam",
        ),
        (
            "cmlm",
            ["--oracle-length"],
            "--oracle-length is for left-to-right search; RUN holds arch 'cmlm', decoded by "
            "mask-predict: give --iterations and --length-beam",
        ),
        (
            "scan",
            ["--iterations", "2"],
            "--iterations is mask-predict's, for runs of arch 'cmlm'; RUN holds arch "
            "'encoder_decoder', decoded left to right (--beam)",
        ),
    ],
)
def test_decoding_options_that_do_not_fit_the_run_are_one_line(tmp_path, run, args, message):
    from golden import SCAN_RUN

    if run == "cmlm":  # a run directory whose weights are never read: the options are refused first
        path = tmp_path / "run"
        path.mkdir()
        (path / "config.yaml").write_text(
            "model: {arch: cmlm}\ndata: {task: masked_translation, "
            "format: parallel, train: x, src_lang: de, tgt_lang: en}\n"
        )
        (path / "shape.json").write_text('{"vocab_size": 20}\n')  # the data's sizes, as a run keeps them
    else:
        path = SCAN_RUN
    for command in ("translate", "evaluate") if "--oracle-length" not in args else ("evaluate",):
        done = run_cli(command, str(path), *args, stdin="eins\n")
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.strip().splitlines() == [f"error: {message.replace('RUN', str(path))}"]
