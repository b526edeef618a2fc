"""Every `attnlab export-hf` imports back: a tiny run of each family with a Hugging Face counterpart
(decoder_lm, with three kinds of tokenizer, and encoder_decoder trained here by attnlab, as GPT-2
and Marian; encoder_only, vit, whisper and ast imported from tiny random BERT, ViT, Whisper and AST
folders) is exported,
everything but the exported folder is deleted, and `attnlab import-hf` of that folder gives a run
whose outputs equal the original's (max abs difference <= 1e-6). transformers' outputs on the
folder equal attnlab's (<= 1e-5 of the logits' scale), and its decode of what the folder's model
generates shows no control token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest
import test_hf_ast
import test_hf_gpt2
import test_hf_import
import test_hf_marian
import test_hf_vit
import test_hf_whisper
import torch
import transformers

from attnlab.data.tokenizers import BOS, EOS, PAD, SPECIAL_TOKENS
from attnlab.interop.folder import EXPORTERS
from attnlab.runs.checkpoint import load_run
from attnlab.tasks.classification import Encoded, collate, encode_inputs

from helpers import run_cli

CONTROL_TOKENS = (*SPECIAL_TOKENS, "</s>", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "[UNK]")


def padded(rows: list[list[int]]) -> torch.Tensor:
    """(B, T) ids, PAD after each row."""
    ids = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    return ids


def imported(folder: Path, out: Path) -> Path:
    done = run_cli("import-hf", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


class Family:
    """One exporter's (``model_type``'s) round trip: the run it starts from, the outputs attnlab's
    model and transformers' give on the same inputs (``order``: the exported folder's id of each run
    id), and transformers' decode of what the folder's model generates ([] for a model of images)."""

    model_type: ClassVar[str]

    def run(self, work: Path) -> Path:
        raise NotImplementedError

    def inputs(self, tokenizers: dict) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def ours(self, model, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return model(*inputs)

    def theirs(self, folder: Path, inputs: tuple[torch.Tensor, ...], order: list[int]) -> torch.Tensor:
        raise NotImplementedError

    def decoded(self, folder: Path) -> list[str]:
        return []


class GPT2(Family):
    """decoder_lm trained by attnlab with GPT-2's options and a tokenizer of kind ``tokenizer`` (char:
    a WordLevel tokenizer.json; byte_bpe: GPT-2's own kind; unigram: a Unigram)."""

    model_type = "gpt2"

    def __init__(self, tokenizer: str) -> None:
        self.tokenizer = tokenizer

    def run(self, work: Path) -> Path:
        (work / "text.txt").write_text("".join(f"{line}\n" for line in test_hf_gpt2.LINES * 20))
        (work / "lm.yaml").write_text(
            "model: {arch: decoder_lm, stack: {d_model: 32, n_heads: 4, n_layers: 2, d_ff: 64, norm: pre, "
            "activation: gelu_tanh, dropout: 0.0}, positions: {scheme: learned, max_len: 32}, "
            "embeddings: {kind: plain, tie: output}}\n"
            f"data: {{task: language_model, train: {work / 'text.txt'}, text: {{tokenizer: {self.tokenizer}, vocab_size: 120}}, "
            "block_size: 16}\n"
            "train: {max_steps: 3, batch_size: 4, lr_schedule: constant, warmup_steps: 1, eval_every: 3, "
            "progress: false}\n"
        )
        done = run_cli("train", str(work / "lm.yaml"), "--out", str(work / "run"))
        assert done.returncode == 0, done.stderr
        return work / "run"

    def inputs(self, tokenizers):
        return (padded([[BOS] + tokenizers["tgt"].encode(t) for t in ("the film was great", "awful!")]),)

    def theirs(self, folder, inputs, order):
        (ids,) = inputs
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        return hf(input_ids=torch.tensor(order)[ids]).logits[..., order]

    def decoded(self, folder):
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        prompt = torch.tensor([[hf.config.bos_token_id] + tokenizer("the film", add_special_tokens=False)["input_ids"]])
        out = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False)
        return tokenizer.batch_decode(out, skip_special_tokens=True)


class Marian(Family):
    """encoder_decoder trained by attnlab with Marian's options and a unigram tokenizer."""

    model_type = "marian"

    def run(self, work: Path) -> Path:
        return test_hf_marian.trained(work)

    def inputs(self, tokenizers):
        src = padded([tokenizers["src"].encode(s) + [EOS] for s in test_hf_marian.SOURCE[:3]])
        tgt = padded([[BOS] + tokenizers["tgt"].encode(t) for t in test_hf_marian.TARGET[:3]])
        return src, tgt

    def theirs(self, folder, inputs, order):
        src, tgt = (torch.tensor(order)[ids] for ids in inputs)
        hf = transformers.MarianMTModel.from_pretrained(folder, attn_implementation="eager").eval()
        logits = hf(input_ids=src, attention_mask=inputs[0] != PAD, decoder_input_ids=tgt).logits[..., order]
        return logits.masked_fill((inputs[1] == PAD)[..., None], 0.0)  # padded targets: no output to compare

    def ours(self, model, inputs):
        return model(*inputs).masked_fill((inputs[1] == PAD)[..., None], 0.0)

    def decoded(self, folder):
        hf = transformers.MarianMTModel.from_pretrained(folder).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        batch = tokenizer(test_hf_marian.SOURCE[:3], return_tensors="pt", padding=True)
        return tokenizer.batch_decode(hf.generate(**batch, max_new_tokens=8, num_beams=1), skip_special_tokens=True)


class BERT(Family):
    """encoder_only with a masked-LM head, imported from a tiny random BertForMaskedLM."""

    model_type = "bert"

    def run(self, work: Path) -> Path:
        return imported(test_hf_import.tiny_folder(work / "hf", masked_lm=True), work / "run")

    def inputs(self, tokenizers):
        pairs = test_hf_import.SENTENCES
        encoded, _ = encode_inputs(tokenizers["src"], [a for a, _ in pairs], [b for _, b in pairs], 32)
        batch = collate([Encoded(ids, segments, 0) for ids, segments in encoded])
        return batch.ids, batch.segments

    def theirs(self, folder, inputs, order):
        ids, segments = inputs
        hf = transformers.AutoModelForMaskedLM.from_pretrained(folder, attn_implementation="eager").eval()
        valid = ids != PAD
        logits = hf(input_ids=torch.tensor(order)[ids], token_type_ids=segments, attention_mask=valid.long()).logits
        return logits[..., order].masked_fill(~valid[..., None], 0.0)  # padding: no output to compare

    def ours(self, model, inputs):
        return model(*inputs).masked_fill((inputs[0] == PAD)[..., None], 0.0)

    def decoded(self, folder):
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        texts = [a for a, _ in test_hf_import.SENTENCES]
        return tokenizer.batch_decode(tokenizer(texts)["input_ids"], skip_special_tokens=True)


class ViT(Family):
    """vit with a classifier, imported from a tiny random ViTForImageClassification."""

    model_type = "vit"

    def run(self, work: Path) -> Path:
        return imported(test_hf_vit.tiny_folder(work / "hf"), work / "run")

    def inputs(self, tokenizers):
        return (torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(0)),)

    def ours(self, model, inputs):
        return model.classify(*inputs)

    def theirs(self, folder, inputs, order):
        hf = transformers.AutoModelForImageClassification.from_pretrained(folder, attn_implementation="eager").eval()
        return hf(pixel_values=inputs[0]).logits


class Whisper(Family):
    """whisper imported from a tiny random WhisperForConditionalGeneration (its own word tokenizer)."""

    model_type = "whisper"

    def run(self, work: Path) -> Path:
        return imported(test_hf_whisper.tiny_folder(work / "hf"), work / "run")

    def inputs(self, tokenizers):
        words = ["one two", "nine", "three three four"]
        return test_hf_whisper.waveforms(), padded([[BOS] + tokenizers["tgt"].encode(w) for w in words])

    def ours(self, model, inputs):
        return model(*inputs).masked_fill((inputs[1] == PAD)[..., None], 0.0)

    def theirs(self, folder, inputs, order):
        sound, tgt = inputs
        logits = test_hf_whisper.reference(folder)(
            input_features=test_hf_whisper.features(folder, sound), decoder_input_ids=tgt
        ).logits
        return logits.masked_fill((tgt == PAD)[..., None], 0.0)  # padded targets: no output to compare

    def decoded(self, folder):
        hf = test_hf_whisper.reference(folder)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        inputs = test_hf_whisper.features(folder, test_hf_whisper.waveforms())
        out = transformers.GenerationMixin.generate(hf, input_features=inputs, max_new_tokens=8, do_sample=False)
        return tokenizer.batch_decode(out, skip_special_tokens=True)


class AST(Family):
    """ast imported from a tiny random ASTForAudioClassification (overlapping patches, two tokens)."""

    model_type = "audio-spectrogram-transformer"

    def run(self, work: Path) -> Path:
        return imported(test_hf_ast.tiny_folder(work / "hf"), work / "run")

    def inputs(self, tokenizers):
        return test_hf_ast.clips(), torch.full((3,), test_hf_ast.SAMPLES)

    def ours(self, model, inputs):
        return model.classify(*inputs)

    def theirs(self, folder, inputs, order):  # on attnlab's features: the extractor's differ by float32 rounding
        return test_hf_ast.reference(folder)(input_values=test_hf_ast.kaldi_features(folder, inputs[0])).logits


FAMILIES = {
    "gpt2-char": GPT2("char"),
    "gpt2-byte_bpe": GPT2("byte_bpe"),
    "gpt2-unigram": GPT2("unigram"),
    "marian": Marian(),
    "bert": BERT(),
    "vit": ViT(),
    "whisper": Whisper(),
    "ast": AST(),
}


def test_every_exporter_has_a_round_trip():
    assert {converter.model_type for converter in EXPORTERS.values()} == {f.model_type for f in FAMILIES.values()}


@pytest.mark.parametrize("name", FAMILIES)
def test_an_export_imports_back_from_its_files_alone(tmp_path, name):
    family = FAMILIES[name]
    (tmp_path / "work").mkdir()
    run = family.run(tmp_path / "work")
    done = run_cli("export-hf", str(run), "--out", str(tmp_path / "exported"))
    assert done.returncode == 0, done.stderr
    model, tokenizers, _ = load_run(run)
    inputs = family.inputs(tokenizers)
    with torch.no_grad():
        original = family.ours(model.eval(), inputs)
    shutil.rmtree(tmp_path / "work")  # the run, its data and any folder it was imported from

    back, back_tokenizers, _ = load_run(imported(tmp_path / "exported", tmp_path / "back"))
    init = json.loads((tmp_path / "back" / "init.json").read_text())
    order = init.get("order", [])
    assert None not in order  # every token of the run is a token of the folder: nothing added
    assert family.inputs(back_tokenizers)[0].equal(inputs[0])
    with torch.no_grad():
        again = family.ours(back.eval(), inputs)
        theirs = family.theirs(tmp_path / "exported", inputs, order)
    assert (again - original).abs().max().item() <= 1e-6
    scale = max(1.0, original.abs().max().item())  # float32: 1e-5 of the logits' scale (~90 for Marian here)
    assert (theirs - original).abs().max().item() <= 1e-5 * scale
    for text in family.decoded(tmp_path / "exported"):
        assert not any(token in text for token in CONTROL_TOKENS), text


def test_a_gpt2_folder_whose_unigram_does_not_number_controls_as_attnlab_is_refused_in_one_line(tmp_path):
    """GPT-2's own layout (an end of text, <pad> <bos> <unk> added) is renumbered only from a token -> id vocabulary."""
    (tmp_path / "work").mkdir()
    run = GPT2("unigram").run(tmp_path / "work")
    assert run_cli("export-hf", str(run), "--out", str(tmp_path / "exported")).returncode == 0
    config = tmp_path / "exported" / "config.json"
    config.write_text(json.dumps(json.loads(config.read_text()) | {"bos_token_id": 5}))
    done = run_cli("import-hf", str(tmp_path / "exported"), "--out", str(tmp_path / "back"))
    assert done.returncode == 5 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr == (
        f"error: {tmp_path / 'exported' / 'tokenizer.json'}: a 'Unigram' tokenizer without "
        f"attnlab's <pad> <bos> <eos> <unk> at ids 0-3; attnlab reads GPT-2's own tokenizer as "
        f"'BPE', 'WordLevel' or 'WordPiece'\n"
    )
    assert not (tmp_path / "back").exists()
