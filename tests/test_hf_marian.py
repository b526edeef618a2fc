"""`attnlab import-hf` of Marian: a tiny random MarianMTModel (2 + 2 layers, d 32, every LayerNorm,
bias and the final_logits_bias perturbed, swish, scaled embeddings) with SentencePiece models
trained here becomes an encoder_decoder run whose encoder states and logits equal transformers'
(float32, max abs difference <= 1e-5, a padded pair batch), whose greedy and beam outputs equal
transformers' generate, whose tokenizers give MarianTokenizer's ids on 20 sentences, and which
translates and inspects from the command line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import sentencepiece
import torch
import transformers

from attnlab.data.tokenizers import PAD
from attnlab.decode.search import beam_search, greedy
from attnlab.runs.checkpoint import load_run
from attnlab.serve.explorer import Explorer

from helpers import run_cli

SOURCE = [
    "the cat sat on the mat",
    "a dog runs in the park",
    "the weather is nice today",
    "I like green tea",
    "attention is all you need",
    "we read the paper twice",
    "the model translates short sentences",
    "numbers like 12 and 345",
    "café and naïve words",
    "where is the station?",
]
TARGET = [
    "die Katze sass auf der Matte",
    "ein Hund rennt im Park",
    "das Wetter ist heute schön",
    "ich mag grünen Tee",
    "Aufmerksamkeit ist alles",
    "wir lasen das Papier zweimal",
    "das Modell übersetzt kurze Sätze",
    "Zahlen wie 12 und 345",
    "Café und naive Wörter",
    "wo ist der Bahnhof?",
]
SENTENCES = {
    "src": SOURCE
    + [
        "the cat runs",
        "a nice park",
        "  leading spaces",
        "trailing spaces   ",
        "two  spaces",
        "THE CAT",
        "tea?",
        "",
        "a",
        "the station is in the park today",
    ],
    "tgt": TARGET
    + [
        "die Katze rennt",
        "ein Hund im Park",
        "  der Tee",
        "das Wetter   ",
        "zwei  Hunde",
        "KATZE",
        "Tee?",
        "",
        "wo",
        "der Bahnhof ist im Park",
    ],
}


def train_spm(lines: list[str], path: Path) -> None:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines * 4),
        model_writer=model,
        vocab_size=60,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
    )
    path.write_bytes(model.getvalue())


def tiny_folder(path: Path, seed: int = 0, eos_bias: float = 0.0) -> Path:
    """A random MarianMTModel saved as transformers saves it, with MarianTokenizer's files: source.spm and
    target.spm trained on SOURCE and TARGET, vocab.json the union of their pieces between Marian's
    </s> (0), <unk> (1) and <pad> (last, the decoder's start)."""
    path.mkdir(parents=True)
    train_spm(SOURCE, path / "source.spm")
    train_spm(TARGET, path / "target.spm")
    pieces = []
    for side in ("source", "target"):
        sp = sentencepiece.SentencePieceProcessor(model_file=str(path / f"{side}.spm"))
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    tokens = ["</s>", "<unk>"] + list(dict.fromkeys(pieces)) + ["<pad>"]
    (path / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
    pad = len(tokens) - 1
    config = transformers.MarianConfig(
        vocab_size=len(tokens),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=None,
        scale_embedding=True,
        activation_function="swish",
        dropout=0.0,
        attention_dropout=0.0,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # the initial LayerNorms and biases are 1 and 0: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        model.final_logits_bias.add_(torch.randn_like(model.final_logits_bias))
        model.final_logits_bias[0, 0] += eos_bias  # sentences that end at different steps
    model.save_pretrained(path, safe_serialization=True)
    transformers.MarianTokenizer(*(str(path / n) for n in ("source.spm", "target.spm", "vocab.json"))).save_pretrained(
        path
    )
    return path


def reference(folder: Path) -> transformers.MarianMTModel:
    return transformers.MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()


def imported(tmp_path: Path, folder: Path, name: str = "run"):
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / name))
    assert done.returncode == 0, done.stderr
    assert "a run of data.task 'translation'" in done.stdout, done.stdout
    model, toks, _ = load_run(tmp_path / name)
    return model.eval(), toks, json.loads((tmp_path / name / "init.json").read_text())["order"]


def padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    ids = torch.full((len(rows), max(map(len, rows))), pad)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    return ids


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tiny_folder(tmp_path_factory.mktemp("marian") / "hf", seed=0, eos_bias=3.0)


def test_positions_are_marians_table(folder):
    from attnlab.nn.positional import HalvesSinusoidalPositional

    theirs = transformers.models.marian.modeling_marian.MarianSinusoidalPositionalEmbedding(64, 32)
    theirs.weight.data = theirs.create_weight()
    positions = torch.arange(64)
    assert torch.allclose(
        HalvesSinusoidalPositional(32).encode(positions), theirs(positions.shape, position_ids=positions), atol=1e-6
    )


def test_encoder_states_and_logits_equal_transformers_on_a_padded_pair_batch(tmp_path, folder):
    model, toks, order = imported(tmp_path, folder)
    hf = reference(folder)
    marian = {old: new for new, old in enumerate(order) if old is not None}
    src = padded([toks["src"].encode(s) + [2] for s in SOURCE[:3]], PAD)
    tgt = padded([[1] + toks["tgt"].encode(t) for t in TARGET[:3]], PAD)
    theirs_src = torch.tensor([o if o is not None else hf.config.decoder_start_token_id for o in order])[src]
    theirs_tgt = torch.tensor([o if o is not None else hf.config.decoder_start_token_id for o in order])[tgt]
    with torch.no_grad():
        memory, valid = model.encode(src)
        logits = model.decode(tgt, memory, valid)
        out = hf(
            input_ids=theirs_src, attention_mask=valid, decoder_input_ids=theirs_tgt, decoder_attention_mask=tgt != PAD
        )
    assert (memory - out.encoder_last_hidden_state)[valid].abs().max() <= 1e-5
    real = tgt != PAD
    ours = logits[..., [marian[i] for i in range(len(order) - 1)]]  # Marian's ids, in its order
    assert (ours - out.logits)[real].abs().max() <= 1e-5
    assert torch.isinf(logits[..., 1]).all()  # the added <bos> is never predicted


def test_the_tokenizers_give_marian_tokenizers_ids(tmp_path, folder):
    """20 sentences a side, unknown words in capitals among them; text in characters neither .spm
    knows is <unk> on both sides (one per run of such characters)."""
    _, toks, order = imported(tmp_path, folder)
    theirs = transformers.MarianTokenizer.from_pretrained(folder)
    for side, key in (("src", "text"), ("tgt", "text_target")):
        for sentence in SENTENCES[side] + ["日本語 text"]:
            expected = theirs(**{key: sentence})["input_ids"]  # ... </s>
            assert [order[i] for i in toks[side].encode(sentence)] + [0] == expected, (side, sentence)
    for sentence in TARGET:
        ids = toks["tgt"].encode(sentence)
        assert toks["tgt"].decode(ids) == theirs.decode([order[i] for i in ids])


def generate(hf, src: torch.Tensor, beam: int, limit: int, min_len: int):
    """transformers' search (sequences without the decoder's start), pad never predicted; at least
    ``min_len`` tokens before the end (attnlab's min_len, transformers' min_new_tokens)."""
    settings = {"length_penalty": 0.0, "early_stopping": False} if beam > 1 else {}
    with torch.no_grad():
        out = hf.generate(
            input_ids=src,
            attention_mask=src != hf.config.pad_token_id,
            num_beams=beam,
            do_sample=False,
            max_new_tokens=limit + 1,
            min_new_tokens=min_len,
            suppress_tokens=[hf.config.pad_token_id],
            **settings,
        )
    return out[:, 1:].tolist()


def until_eos(rows: list[list[int]]) -> list[list[int]] | None:
    return [seq[: seq.index(0)] for seq in rows] if all(0 in seq for seq in rows) else None


@pytest.mark.parametrize("beam", [1, 3])
def test_greedy_and_beam_search_equal_transformers_generate(tmp_path, folder, beam):
    model, toks, order = imported(tmp_path, folder)
    hf = reference(folder)
    src = padded([toks["src"].encode(s) + [2] for s in SOURCE[:6]], PAD)
    theirs_src = torch.tensor([o if o is not None else hf.config.pad_token_id for o in order])[src]
    limit, min_len = 20, 8
    expected = until_eos(generate(hf, theirs_src, beam, limit, min_len))
    assert expected is not None and min(map(len, expected)) >= min_len  # every sentence ended, after >= 8 steps
    with torch.no_grad():
        ours = (
            greedy(model, src, max_len=limit, min_len=min_len)
            if beam == 1
            else [
                hyps[0].tokens
                for hyps in beam_search(model, src, beam=beam, lenpen=0.0, max_len=limit, min_len=min_len)
            ]
        )
    assert [[order[i] for i in row] for row in ours] == expected


def test_the_imported_run_translates_inspects_prunes_and_serves(tmp_path, folder):
    model, toks, _ = imported(tmp_path, folder)
    run = str(tmp_path / "run")
    done = run_cli("translate", run, "--beam", "2", "--max-len", "10", stdin="the cat sat on the mat\nI like tea\n")
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 2, done.stderr
    src = padded([toks["src"].encode("the cat sat on the mat") + [2]], PAD)
    assert done.stdout.splitlines()[0] == toks["tgt"].decode(beam_search(model, src, beam=2, max_len=10)[0][0].tokens)
    done = run_cli("inspect", run, "--src", "the cat sat", "--tgt", "die Katze", "--out", str(tmp_path / "maps"))
    assert done.returncode == 0, done.stderr
    assert any((tmp_path / "maps").iterdir())
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(SOURCE, TARGET)))
    done = run_cli(
        "prune",
        run,
        "--fraction",
        "0.25",
        "--data",
        str(tmp_path / "pairs.tsv"),
        "--limit",
        "4",
        "--out",
        str(tmp_path / "pruned"),
    )
    assert done.returncode == 0, done.stderr
    served = Explorer(tmp_path / "run").run({"text": "the cat sat"})
    assert served["task"] == "translation" and served["attention"]


def edit_config(folder: Path, **fields) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


@pytest.mark.parametrize(
    "change,message",
    [
        (
            lambda f: edit_config(f, share_encoder_decoder_embeddings=False, decoder_ffn_dim=48),
            "{f}/config.json: share_encoder_decoder_embeddings False; encoder_ffn_dim 64 unlike decoder_ffn_dim 48 (attnlab "
            "has one d_ff): not representable in attnlab's encoder_decoder",
        ),
        (
            lambda f: edit_config(f, encoder_ffn_dim=48, decoder_ffn_dim=48),
            "{f}/model.safetensors: model.encoder.layers.0.fc1.weight has shape (64, 32); config.json gives (48, 32)",
        ),
        (lambda f: (f / "target.spm").unlink(), "{f}: missing vocab.json + source.spm + target.spm"),
        (lambda f: (f / "source.spm").write_bytes(b"not a model"), "{f}/source.spm: not a SentencePiece model"),
    ],
)
def test_a_marian_folder_attnlab_cannot_import_is_refused_in_one_line(tmp_path, change, message):
    folder = tiny_folder(tmp_path / "hf")
    change(folder)
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    assert done.returncode == 5 and done.stderr.startswith("error: " + message.format(f=folder)), done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()


def test_import_then_export_gives_transformers_the_same_model_and_tokenizer(tmp_path, folder):
    imported(tmp_path, folder)
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "exported"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        f"exported {tmp_path / 'run'} as a Hugging Face marian folder (config.json, model.safetensors, "
        f"source.spm, target.spm, tokenizer_config.json, vocab.json): {tmp_path / 'exported'}\n"
    )
    theirs_tok = transformers.MarianTokenizer.from_pretrained(folder)
    ours_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "exported")
    for side, key in (("src", "text"), ("tgt", "text_target")):
        for sentence in SENTENCES[side]:
            assert ours_tok(**{key: sentence})["input_ids"] == theirs_tok(**{key: sentence})["input_ids"], (
                side,
                sentence,
            )
    batch = theirs_tok(SOURCE[:3], text_target=TARGET[:3], padding=True, return_tensors="pt")
    theirs, ours = reference(folder), reference(tmp_path / "exported")
    with torch.no_grad():
        a, b = (
            m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
            for m in (theirs, ours)
        )
    assert (a.logits - b.logits).abs().max() <= 1e-5
    assert ours.generation_config.decoder_start_token_id == theirs.config.decoder_start_token_id


def test_an_export_of_options_marian_lacks_names_them_all_in_one_line(tmp_path, folder):
    imported(tmp_path, folder)
    config = tmp_path / "run" / "config.yaml"
    config.write_text(
        config.read_text().replace("norm: post", "norm: pre").replace("scheme: sinusoidal_halves", "scheme: sinusoidal")
    )
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "exported"))
    assert done.returncode != 0 and done.stderr == (
        f"error: {tmp_path / 'run'}: Marian, opus-mt has no counterpart for positions.scheme 'sinusoidal' (Marian's is "
        f"'sinusoidal_halves'); stack.norm 'pre' (Marian's is 'post')\n"
    )
    assert not (tmp_path / "exported").exists()


def trained(tmp_path: Path) -> Path:
    """A tiny encoder_decoder trained by attnlab with Marian's options, for 3 steps."""
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(SOURCE, TARGET)) * 10)
    (tmp_path / "mt.yaml").write_text(
        "model: {arch: encoder_decoder, stack: {d_model: 32, n_heads: 4, n_layers: 2, d_ff: 64, activation: silu, "
        "dropout: 0.0}, positions: {scheme: sinusoidal_halves, max_len: 64}, output: {bias: true}}\n"
        f"data: {{task: translation, format: tsv, train: {tmp_path / 'pairs.tsv'}, valid: {tmp_path / 'pairs.tsv'}, "
        "text: {tokenizer: unigram, vocab_size: 80}}\n"
        "train: {max_steps: 3, max_tokens: 256, lr_schedule: constant, warmup_steps: 1, eval_every: 3, progress: false}\n"
    )
    done = run_cli("train", str(tmp_path / "mt.yaml"), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    return tmp_path / "run"


def test_a_run_trained_by_attnlab_with_marians_options_exports(tmp_path):
    """Every id kept (its <bos> the decoder's start), the unigram tokenizer written as both .spm files."""
    trained(tmp_path)
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    model, toks, _ = load_run(tmp_path / "run")
    theirs_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for side, key in (("src", "text"), ("tgt", "text_target")):
        for sentence in SOURCE + TARGET:
            assert theirs_tok(**{key: sentence})["input_ids"] == toks[side].encode(sentence) + [2], sentence
    src = padded([toks["src"].encode(s) + [2] for s in SOURCE[:3]], PAD)
    tgt = padded([[1] + toks["tgt"].encode(t) for t in TARGET[:3]], PAD)
    with torch.no_grad():
        ours = model.eval()(src, tgt)
        theirs = reference(tmp_path / "hf")(input_ids=src, attention_mask=src != PAD, decoder_input_ids=tgt).logits
    diff = (ours - theirs)[tgt != PAD].abs().max().item()
    assert diff <= 1e-5 * max(1.0, ours.abs().max().item()), diff  # within 1e-5 of the logits' scale


def test_fine_tuning_the_imported_run_asks_for_no_label_smoothing_then_trains(tmp_path, folder):
    """Its <bos> has logit -inf (output.vocabulary: no_bos): label smoothing would give it probability."""
    imported(tmp_path, folder)
    (tmp_path / "pairs.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in zip(SOURCE, TARGET)))
    data = (
        f"data: {{task: translation, format: tsv, train: {tmp_path / 'pairs.tsv'}, valid: {tmp_path / 'pairs.tsv'}}}\n"
    )
    train = f"init_from: {tmp_path / 'run'}, max_steps: 2, max_tokens: 256, lr_schedule: constant, progress: false"
    (tmp_path / "smoothed.yaml").write_text(data + f"train: {{{train}}}\n")
    done = run_cli("train", str(tmp_path / "smoothed.yaml"), "--out", str(tmp_path / "tuned"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "model.output.vocabulary 'no_bos' gives some tokens logit -inf" in done.stderr
    (tmp_path / "plain.yaml").write_text(data + f"train: {{{train}, label_smoothing: 0.0, warmup_steps: 1}}\n")
    done = run_cli("train", str(tmp_path / "plain.yaml"), "--out", str(tmp_path / "tuned"))
    assert done.returncode == 0, done.stderr


def test_a_run_whose_sides_have_different_vocabularies_is_refused_in_one_line(tmp_path, folder):
    """Marian numbers both sides with one vocab.json: a run whose target tokens differ is refused."""
    imported(tmp_path, folder)
    path = tmp_path / "run" / "tokenizer-tgt.json"
    spec = json.loads(path.read_text())
    spec["model"]["vocab"][10][0] = "▁renamed"
    path.write_text(json.dumps(spec))
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf"))
    assert done.returncode != 0 and done.stderr == (
        f"error: {tmp_path / 'run'}: Marian, opus-mt has no counterpart for separate source and target vocabularies "
        f"(Marian's one vocab.json numbers both sides)\n"
    )
