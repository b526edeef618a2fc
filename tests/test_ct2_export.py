"""`attnlab export-ct2`: a tiny translation run trained here on a reversal task and a tiny language
model become CTranslate2 models whose greedy tokens (ctranslate2.Translator, ctranslate2.Generator)
equal attnlab's greedy decode row by row; runs and options CTranslate2 cannot take, a missing
extra and an unknown weight type are refused in one line, before anything is written."""

from __future__ import annotations

import importlib.util
import json
import random
import shutil
from pathlib import Path

import numpy
import pytest
import torch
from test_hf_marian import SOURCE, tiny_folder

from attnlab.data.tokenizers import BOS, EOS, PAD
from attnlab.decode.search import greedy
from attnlab.runs.checkpoint import load_run

from helpers import run_cli

ctranslate2 = pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

WORDS = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]


def sentences(n: int, seed: int) -> list[list[str]]:
    rng = random.Random(seed)
    return [[rng.choice(WORDS) for _ in range(rng.randint(2, 6))] for _ in range(n)]


def train(tmp: Path, name: str, model: str, data: str, train: str) -> Path:
    (tmp / f"{name}.yaml").write_text(
        f"model: {{{model}}}\ndata: {{{data}}}\n"
        f"train: {{{train}, lr: 0.003, lr_schedule: constant, warmup_steps: 1, "
        f"progress: false}}\n"
    )
    done = run_cli("train", str(tmp / f"{name}.yaml"), "--out", str(tmp / name))
    assert done.returncode == 0, done.stderr
    return tmp / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A translation run trained to reverse sentences (Marian's options) and a language model of the
    same sentences (GPT-2's), 200 steps each."""
    tmp = tmp_path_factory.mktemp("ct2")
    pairs = sentences(120, seed=0)
    (tmp / "pairs.tsv").write_text("".join(f"{' '.join(s)}\t{' '.join(reversed(s))}\n" for s in pairs))
    (tmp / "text.txt").write_text("".join(f"{' '.join(s)}\n" for s in pairs))
    stack = "d_model: 32, n_heads: 4, n_layers: 2, d_ff: 64, dropout: 0.0"
    translation = train(
        tmp,
        "mt",
        f"arch: encoder_decoder, stack: {{{stack}, activation: relu}}, positions: {{scheme: sinusoidal_halves, max_len: 64}}",
        f"task: translation, format: tsv, train: {tmp / 'pairs.tsv'}, valid: {tmp / 'pairs.tsv'}, "
        f"text: {{tokenizer: unigram, vocab_size: 30}}",
        "max_steps: 200, max_tokens: 96, eval_every: 200",
    )
    language_model = train(
        tmp,
        "lm",
        f"arch: decoder_lm, stack: {{{stack}, norm: pre, activation: gelu_tanh}}, positions: {{scheme: "
        f"learned, max_len: 32}}, embeddings: {{kind: plain, tie: output}}",
        f"task: language_model, train: {tmp / 'text.txt'}, valid: {tmp / 'text.txt'}, "
        f"text: {{tokenizer: byte_bpe, vocab_size: 270}}, block_size: 16",
        "max_steps: 200, batch_size: 4, eval_every: 200",
    )
    return {"mt": translation, "lm": language_model}


def exported(run: Path, out: Path, *options: str) -> list[str]:
    """The run exported to ``out``; the CTranslate2 model's tokens, by attnlab id."""
    done = run_cli("export-ct2", str(run), "--out", str(out), *options)
    assert done.returncode == 0, done.stderr
    vocabulary = next(out.glob("*vocabulary.json"))
    return json.loads(vocabulary.read_text())


def test_the_translators_greedy_tokens_are_attnlabs(runs, tmp_path):
    """Sources end with </s> as the run's do; the decoder starts from <bos>'s embedding, every row kept."""
    tokens = exported(runs["mt"], tmp_path / "ct2")
    model, tokenizers, _ = load_run(runs["mt"])
    sources = [tokenizers["src"].encode(" ".join(s)) + [EOS] for s in sentences(12, seed=1)]
    batch = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sources], batch_first=True, padding_value=PAD)
    ours = greedy(model.eval(), batch, max_len=24)
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    results = translator.translate_batch(
        [[tokens[i] for i in s] for s in sources], beam_size=1, max_decoding_length=24, min_decoding_length=0
    )  # CTranslate2's default is 1; attnlab's, 0
    theirs = [[tokens.index(t) for t in result.hypotheses[0]] for result in results]
    assert theirs == ours and len({len(row) for row in ours}) > 1  # rows that end at different steps


def test_a_run_imported_from_marian_deploys_in_marians_ids(tmp_path):
    """export-hf puts Marian's tokens back at their ids (<pad> last, the decoder's start): CTranslate2
    starts from that row, as transformers and attnlab do, and keeps it."""
    folder = tiny_folder(tmp_path / "hf", eos_bias=1.0)
    assert run_cli("import-hf", str(folder), "--out", str(tmp_path / "run")).returncode == 0
    tokens = exported(tmp_path / "run", tmp_path / "ct2")
    assert tokens == list(json.loads((folder / "vocab.json").read_text()))
    model, tokenizers, _ = load_run(tmp_path / "run")
    order = json.loads((tmp_path / "run" / "init.json").read_text())["order"]  # attnlab id -> Marian's
    sources = [tokenizers["src"].encode(s) + [EOS] for s in SOURCE]
    batch = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in sources], batch_first=True, padding_value=PAD)
    ours = [[order[i] for i in row] for row in greedy(model.eval(), batch, max_len=12)]
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    results = translator.translate_batch(
        [[tokens[order[i]] for i in s] for s in sources], beam_size=1, max_decoding_length=12, min_decoding_length=0
    )
    assert [[tokens.index(t) for t in result.hypotheses[0]] for result in results] == ours
    assert len({len(row) for row in ours}) > 1


def test_the_generators_greedy_tokens_are_attnlabs(runs, tmp_path):
    tokens = exported(runs["lm"], tmp_path / "ct2")
    model, tokenizers, _ = load_run(runs["lm"])
    prompts = [[BOS] + tokenizers["tgt"].encode(" ".join(s)) for s in sentences(6, seed=2)]
    ours = [greedy(model.eval(), prompt=torch.tensor([p]), max_len=12)[0] for p in prompts]
    generator = ctranslate2.Generator(str(tmp_path / "ct2"), device="cpu")
    results = generator.generate_batch(
        [[tokens[i] for i in p] for p in prompts], max_length=12, sampling_topk=1, include_prompt_in_result=False
    )
    assert [[tokens.index(t) for t in result.sequences[0]] for result in results] == ours


@pytest.mark.parametrize("kind", ["mt", "lm"])
def test_pad_and_bos_are_never_output_as_in_attnlabs_decoding(runs, tmp_path, kind):
    """attnlab's decoding gives <pad> and <bos> log-probability -inf; the exported projection's bias does."""
    tokens = exported(runs[kind], tmp_path / "ct2", *(("--quantization", "int8") if kind == "lm" else ()))
    if kind == "mt":
        engine = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
        result = engine.translate_batch(
            [[tokens[5], "</s>"]], beam_size=1, max_decoding_length=3, min_decoding_length=0, return_logits_vocab=True
        )[0]
    else:
        engine = ctranslate2.Generator(str(tmp_path / "ct2"), device="cpu")
        result = engine.generate_batch([[tokens[5]]], max_length=3, return_logits_vocab=True)[0]
    logits = torch.from_numpy(numpy.array(result.logits[0][0]))  # (V,): the first step's
    barred = [tokens.index("<pad>"), tokens.index("<bos>")]
    assert torch.isneginf(logits[barred]).all() and logits.isfinite().sum() == len(tokens) - 2


def test_int8_weights_are_stored_smaller_and_translate(runs, tmp_path):
    tokens = exported(runs["mt"], tmp_path / "int8", "--quantization", "int8")
    exported(runs["mt"], tmp_path / "fp32")
    assert (tmp_path / "int8" / "model.bin").stat().st_size < 0.6 * (tmp_path / "fp32" / "model.bin").stat().st_size
    _, tokenizers, _ = load_run(runs["mt"])
    source = [tokens[i] for i in tokenizers["src"].encode("a b c") + [EOS]]
    translated = ctranslate2.Translator(str(tmp_path / "int8"), device="cpu").translate_batch([source])
    assert translated[0].hypotheses[0] and set(translated[0].hypotheses[0]) <= set(tokens)


def refused(run: Path, out: Path, *options: str) -> str:
    done = run_cli("export-ct2", str(run), "--out", str(out), *options)
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert not out.exists()
    return done.stderr


def edited(run: Path, tmp_path: Path, *changes: tuple[str, str]) -> Path:
    copy = shutil.copytree(run, tmp_path / "edited")
    text = (copy / "config.yaml").read_text()
    for old, new in changes:
        assert old in text
        text = text.replace(old, new)
    (copy / "config.yaml").write_text(text)
    return copy


def test_options_ctranslate2_cannot_take_are_named_in_one_line(runs, tmp_path):
    run = edited(runs["lm"], tmp_path, ("scheme: learned", "scheme: rotary"), ("norm: pre", "norm: post"))
    assert refused(run, tmp_path / "out") == (
        f"error: {run}: CTranslate2 deploys it as GPT-2, which has no counterpart for positions.scheme 'rotary' (GPT-2's is "
        f"'learned'); stack.norm 'post' (GPT-2's is 'pre')\n"
    )


def test_a_run_of_another_family_is_refused_in_one_line(runs, tmp_path):
    run = edited(
        runs["lm"],
        tmp_path,
        ("arch: decoder_lm", "arch: encoder_only"),
        ("  multi_token_heads: 0\n", ""),
        ("  multi_token_weight: 1.0\n", ""),
        ("  output:\n    bias: false\n    vocabulary: all\n", ""),
    )
    assert refused(run, tmp_path / "out") == (
        f"error: {run}: arch 'encoder_only' has no CTranslate2 export (it deploys arch 'decoder_lm' (as GPT-2, "
        f"ctranslate2.Generator), 'encoder_decoder' (as Marian, opus-mt, ctranslate2.Translator))\n"
    )


def test_an_unknown_weight_type_and_a_missing_extra_are_refused_in_one_line(runs, tmp_path, monkeypatch):
    assert "--quantization 'int4': CTranslate2 stores float32, int8," in refused(
        runs["lm"], tmp_path / "out", "--quantization", "int4"
    )
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ctranslate2" else find_spec(name, *a)
    )
    assert refused(runs["lm"], tmp_path / "out") == (
        "error: export-ct2: the ct2 extra is not installed (no ctranslate2): pip install 'attnlab[ct2]'\n"
    )
