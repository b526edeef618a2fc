"""`attnlab import-hf` / `export-hf` of GPT-2: a tiny random GPT2LMHeadModel (2 layers, d 32, every
LayerNorm and bias perturbed) and a byte-level BPE trained here become a decoder_lm run whose hidden
states and logits equal transformers' (float32, max abs difference <= 1e-5, a right-padded batch
with an attention mask), whose greedy and beam outputs equal transformers' generate, whose
tokenizer gives GPT2TokenizerFast's ids, and which exports back to a folder that transformers
loads with the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from tokenizers import ByteLevelBPETokenizer

from attnlab.data.tokenizers import BOS, EOS, PAD, UNK
from attnlab.decode.search import beam_search, greedy
from attnlab.models.transformer_config import Output
from attnlab.runs.checkpoint import load_run
from attnlab.serve.explorer import Explorer

from helpers import run_cli

LINES = [
    "the film was great and the plot was long",
    "a very long movie, it was not good!",
    "Attention is all you need.",
    "GPT-2 reads bytes: café, naïve, 日本語 ok",
    "  spaces  and\ttabs\n",
]
SENTENCES = [
    "the film was great",
    "a very long plot",
    "it was not good",
    "awful!",
    "The Movies were GOOD",
    "Hello, world.",
    "attention is all you need",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines",
    "café naïve résumé",
    "日本語のテキスト",
    "numbers 12345 and 3.14",
    "emoji 🙂 too",
    "MiXeD CaSe WoRdS",
    "punctuation?! ... ;:",
    "a",
    "",
    "don't won't can't",
    "<|endoftext|> typed as text",
]


def tiny_folder(path: Path, seed: int = 0, eos_boost: float = 1.0) -> Path:
    """A random GPT2LMHeadModel saved as transformers saves it, with a byte-level BPE tokenizer.json
    trained on LINES (its <|endoftext|> first, id 0: the import must not assume GPT-2's 50256)."""
    path.mkdir(parents=True)
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        LINES * 3, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"], show_progress=False
    )
    tok.save(str(path / "tokenizer.json"))
    eot = tok.token_to_id("<|endoftext|>")
    config = transformers.GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=eot,
        eos_token_id=eot,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # the initial LayerNorms and biases are 1 and 0: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        model.transformer.wte.weight[eot] *= eos_boost  # texts that end at different steps
    model.save_pretrained(path, safe_serialization=True)
    return path


def reference(folder: Path) -> transformers.GPT2LMHeadModel:
    return transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()


def imported(tmp_path: Path, folder: Path, name: str = "run") -> tuple[torch.nn.Module, object, list]:
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / name))
    assert done.returncode == 0, done.stderr
    assert (
        "a run of data.task 'language_model'; its commands: generate, score, inspect, prune, and "
        "train.init_from to fine-tune it"
    ) in done.stdout.splitlines()
    model, toks, _ = load_run(tmp_path / name)
    return model, toks["tgt"], json.loads((tmp_path / name / "init.json").read_text())["order"]


def test_states_and_logits_equal_transformers_on_a_padded_batch(tmp_path):
    folder = tiny_folder(tmp_path / "hf")
    model, tok, order = imported(tmp_path, folder)
    texts = ["the film was great and long", "a very long plot", "awful!"]
    rows = [tok.encode(t) for t in texts]
    ids = torch.full((len(rows), max(map(len, rows))), PAD)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
    valid = ids != PAD
    text_ids = [i for i in range(len(order)) if order[i] is not None]
    theirs_ids = torch.tensor([o if o is not None else order[EOS] for o in order])[ids]
    with torch.no_grad():
        theirs = reference(folder)(input_ids=theirs_ids, attention_mask=valid.long(), output_hidden_states=True)
        hidden = (model.states(ids) - theirs.hidden_states[-1])[valid].abs().max().item()
        logits = model(ids)
        diff = (logits[..., text_ids] - theirs.logits[..., [order[i] for i in text_ids]])[valid].abs().max().item()
    assert hidden <= 1e-5 and diff <= 1e-5, (hidden, diff)
    assert logits[..., list(Output.NEVER["text"])].eq(-torch.inf).all()  # <pad> <bos> <unk>: never predicted
    assert Output.NEVER["text"] == (PAD, BOS, UNK) and Output.NEVER["no_bos"] == (BOS,)


def test_the_tokenizer_gives_gpt2_tokenizer_fasts_ids(tmp_path):
    folder = tiny_folder(tmp_path / "hf")
    _, tok, order = imported(tmp_path, folder)
    theirs = transformers.GPT2TokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    assert len(SENTENCES) == 20
    for text in SENTENCES[:-1]:
        assert [order[i] for i in tok.encode(text)] == theirs(text)["input_ids"], text
        assert tok.decode(tok.encode(text)) == text
    # GPT-2's tokenizer reads a typed <|endoftext|> as the special token; attnlab's as the text it is
    typed = tok.encode(SENTENCES[-1])
    assert EOS not in typed and tok.decode(typed) == SENTENCES[-1]


def test_the_vocab_json_and_merges_txt_of_older_folders_give_the_same_run(tmp_path):
    folder = tiny_folder(tmp_path / "hf")
    ByteLevelBPETokenizer.from_file  # noqa: B018  (the library writes both files)
    spec = json.loads((folder / "tokenizer.json").read_text())
    (folder / "vocab.json").write_text(json.dumps(spec["model"]["vocab"]))
    merges = spec["model"]["merges"]
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "".join((" ".join(m) if isinstance(m, list) else m) + "\n" for m in merges)
    )
    _, from_json, _ = imported(tmp_path, folder, "a")
    (folder / "tokenizer.json").unlink()
    _, from_files, _ = imported(tmp_path, folder, "b")
    assert all(from_files.encode(t) == from_json.encode(t) for t in SENTENCES)


def generate(hf, prompt: torch.Tensor, beam: int, limit: int, eot: int, min_len: int = 0):
    with torch.no_grad():
        out = hf.generate(
            input_ids=prompt,
            attention_mask=torch.ones_like(prompt),
            num_beams=beam,
            min_new_tokens=min_len,
            num_return_sequences=beam,
            length_penalty=0.0,
            early_stopping=False,
            do_sample=False,
            max_new_tokens=limit + 1,
            eos_token_id=eot,
            pad_token_id=eot,
            output_scores=True,
            return_dict_in_generate=True,
        )
    rows = out.sequences[:, prompt.shape[1] :].view(len(prompt), beam, -1).tolist()
    return rows, (out.sequences_scores.view(len(prompt), beam).tolist() if beam > 1 else None)


def until_eos(rows: list[list[int]], eot: int) -> list[list[int]] | None:
    return [seq[: seq.index(eot)] for seq in rows] if all(eot in seq for seq in rows) else None


@pytest.mark.parametrize("seed,eos_boost", [(1, 3.0), (3, 3.0)])
def test_greedy_and_beam_search_equal_transformers_generate(tmp_path, seed, eos_boost):
    """Random models end early or never; at least 8 tokens (min_len, transformers' min_new_tokens:
    both rule EOS out before) and a strong end of text make beams that end soon after."""
    folder = tiny_folder(tmp_path / "hf", seed, eos_boost)
    model, tok, order = imported(tmp_path, folder)
    hf, eot = reference(folder), order[EOS]
    texts = ("the film was", "a very long", "it was not", "Attention")
    ours_prompt = torch.tensor([tok.encode(t)[:2] for t in texts])  # (4, 2): prompts of one length
    theirs_prompt = torch.tensor([[order[i] for i in row] for row in ours_prompt.tolist()])
    to_theirs = lambda row: [order[i] for i in row]  # noqa: E731
    limit = 12
    ours = greedy(model, prompt=ours_prompt, max_len=limit, min_len=8)
    theirs, _ = generate(hf, theirs_prompt, 1, limit - 1, eot, min_len=8)
    for mine, row in zip(ours, theirs):
        row = row[0]
        assert to_theirs(mine) == (row[: row.index(eot)] if eot in row else row)
    assert max(map(len, ours)) >= 8, ours
    compared = 0
    for beam in (2, 4):
        hyps = beam_search(model, prompt=ours_prompt, beam=beam, lenpen=0.0, nbest=beam, max_len=30, min_len=8)
        sequences, scores = generate(hf, theirs_prompt, beam, 30, eot, min_len=8)
        for i, rows in enumerate(sequences):
            ended = until_eos(rows, eot)
            if ended is None:
                continue
            assert [to_theirs(h.tokens) for h in hyps[i]] == ended
            assert [h.score for h in hyps[i]] == pytest.approx(scores[i], abs=1e-4)
            compared += 1
            assert min(len(h.tokens) for h in hyps[i]) >= 8
    assert compared >= 3, "too few beams ended before the limit: nothing much compared"


def test_import_then_export_gives_transformers_the_same_model_and_tokenizer(tmp_path):
    folder = tiny_folder(tmp_path / "hf")
    imported(tmp_path, folder)
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back"))
    assert done.returncode == 0, done.stderr
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back", attn_implementation="eager").eval()
    original = reference(folder)
    ids = torch.tensor([[5, 17, 200, 3, 44, 0, 120], [9, 8, 7, 6, 5, 4, 3]])
    with torch.no_grad():
        diff = (back(input_ids=ids).logits - original(input_ids=ids).logits).abs().max().item()
    assert diff <= 1e-5, diff
    assert back.config.eos_token_id == original.config.eos_token_id
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    reference_tok = transformers.GPT2TokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    for text in SENTENCES:
        assert theirs(text)["input_ids"] == reference_tok(text)["input_ids"], text


def test_a_run_trained_by_attnlab_with_gpt2s_options_exports_with_its_whole_vocabulary(tmp_path):
    (tmp_path / "text.txt").write_text("".join(f"{line}\n" for line in LINES * 20))
    (tmp_path / "lm.yaml").write_text(
        f"model: {{arch: decoder_lm, stack: {{d_model: 32, n_heads: 4, n_layers: 2, d_ff: 64, norm: pre, "
        f"activation: gelu_tanh, dropout: 0.0}}, positions: {{scheme: learned, max_len: 32}}, "
        f"embeddings: {{kind: plain, tie: output}}}}\n"
        f"data: {{task: language_model, train: {tmp_path / 'text.txt'}, text: {{tokenizer: byte_bpe, vocab_size: 290}}, "
        f"block_size: 16}}\n"
        f"train: {{max_steps: 3, batch_size: 4, lr_schedule: constant, warmup_steps: 1, eval_every: 3, progress: false}}\n"
    )
    assert run_cli("train", str(tmp_path / "lm.yaml"), "--out", str(tmp_path / "run")).returncode == 0
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    model, tokenizers, _ = load_run(tmp_path / "run")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    ids = torch.tensor([tokenizers["tgt"].encode("the film was great and the plot")])
    with torch.no_grad():
        ours = model(ids)
        diff = (back(input_ids=ids).logits - ours).abs().max().item()
    assert diff <= 1e-5 * max(1.0, ours.abs().max().item()), diff  # within 1e-5 of the logits' scale (~50 here)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert all(theirs(t, add_special_tokens=False)["input_ids"] == tokenizers["tgt"].encode(t) for t in SENTENCES[:-1])


def test_the_imported_run_generates_scores_inspects_prunes_and_serves(tmp_path):
    imported(tmp_path, tiny_folder(tmp_path / "hf"))
    run = str(tmp_path / "run")
    done = run_cli("generate", run, "--prompt", "the film", "--max-new-tokens", "8", "--top-k", "1", "--seed", "0")
    assert done.returncode == 0 and done.stdout.startswith("the film"), done.stderr
    (tmp_path / "text.txt").write_text("".join(f"{line}\n" for line in LINES * 4))
    done = run_cli("score", run, "--tgt", str(tmp_path / "text.txt"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tokens"] > 5
    done = run_cli("inspect", run, "--src", "the film was great", "--out", str(tmp_path / "maps"))
    assert done.returncode == 0, done.stderr
    done = run_cli(
        "prune", run, "--fraction", "0.25", "--data", str(tmp_path / "text.txt"), "--out", str(tmp_path / "pruned")
    )
    assert done.returncode == 0, done.stderr
    served = Explorer(tmp_path / "run").run({"text": "the film was"})
    assert served["task"] == "language_model" and len(served["attention"]) == 2


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda f: (f / "config.json").unlink(), "{f}: no config.json, so nothing says what model the folder holds"),
        (
            lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
            "{f}: the weights are a pickled pytorch_model.bin, which can run code when loaded",
        ),
        (
            lambda f: edit_config(f, model_type="llama"),
            "{f}/config.json: model_type is 'llama'; attnlab imports model_type "
            "'audio-spectrogram-transformer' (AST), 'bert' (BERT, MiniLM, all-MiniLM-L6-v2), 'gpt2' (GPT-2), "
            "'marian' (Marian, opus-mt), 'vit' (ViT), 'whisper' (Whisper)",
        ),
        (
            lambda f: edit_config(f, embd_pdrop=0.3, scale_attn_by_inverse_layer_idx=True),
            "{f}/config.json: scale_attn_by_inverse_layer_idx True; embd_pdrop 0.3 unlike resid_pdrop 0.0 (attnlab has one "
            "dropout): not representable in attnlab's decoder_lm",
        ),
        (
            lambda f: edit_config(f, n_inner=48),
            "{f}/model.safetensors: h.0.mlp.c_fc.weight has shape (32, 128); config.json gives (32, 48)",
        ),
        (lambda f: (f / "tokenizer.json").unlink(), "{f}: missing tokenizer.json or vocab.json + merges.txt"),
    ],
)
def test_a_folder_attnlab_cannot_import_is_refused_in_one_line(tmp_path, change, message):
    folder = tiny_folder(tmp_path / "hf")
    change(folder)
    done = run_cli("import-hf", str(folder), "--out", str(tmp_path / "run"))
    assert done.returncode == 5 and done.stderr.startswith("error: " + message.format(f=folder)), done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "run").exists()


def test_a_pickled_checkpoint_is_never_opened(tmp_path, monkeypatch):
    folder = tiny_folder(tmp_path / "hf")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    opened = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: opened.append(a))
    assert run_cli("import-hf", str(folder), "--out", str(tmp_path / "run")).returncode == 5
    assert opened == []


def edit_config(folder: Path, **fields) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | fields))


def test_an_export_of_options_gpt2_lacks_names_them_all_in_one_line(tmp_path):
    imported(tmp_path, tiny_folder(tmp_path / "hf"))
    config = tmp_path / "run" / "config.yaml"
    text = config.read_text()
    for old, new in (
        ("scheme: learned", "scheme: rotary"),
        ("norm: pre", "norm: post"),
        ("    tie: output", "    tie: none"),
    ):
        assert old in text
        text = text.replace(old, new)
    config.write_text(text)
    done = run_cli("export-hf", str(tmp_path / "run"), "--out", str(tmp_path / "back"))
    assert done.returncode == 3 and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr == (
        f"error: {tmp_path / 'run'}: GPT-2 has no counterpart for positions.scheme 'rotary' (GPT-2's is "
        f"'learned'); stack.norm 'post' (GPT-2's is 'pre'); embeddings.tie 'none' (GPT-2's is 'output')\n"
    )
    assert not (tmp_path / "back").exists()
