"""The figures of ``attnlab inspect``: one input through a trained model, every attention map drawn.

Each function here draws one kind of model; a task's view (attnlab/views/) chooses the one its
runs are drawn with. :func:`inspect_sequence`: for an encoder-decoder (Transformer or recurrent)
the target is the given reference or, without one, the model's own beam-search output; the maps
are those of one teacher-forced pass over it (:func:`attnlab.analysis.capture.attention_of`); a
language model reads the text alone. It writes one heatmap PNG per attention module, an alignment
plot per cross-attention layer (heads averaged), an entropy plot, and summary.json with each
head's entropy and mean distance. :func:`inspect_encoder`: an encoder-only model reads the text as
its task does (``a TAB b``: a pair), and adds the attention of the first token, [CLS], per layer
and head, and a classifier's prediction. The models that read an image (an image classifier, a
captioner) are drawn by analysis/inspect_images.py; a single-stream model, which reads an image
file and a question, by analysis/cross_modal.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, cast

import torch
from torch import Tensor, nn

from attnlab.analysis.capture import AttentionRecord, attention_of, capture_attention
from attnlab.analysis.heads import head_entropy, mean_distance
from attnlab.analysis.plots import (
    alignment_plot,
    attention_heatmaps,
    entropy_plot,
    first_token_plot,
)
from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import BOS, EOS, Tokenizer
from attnlab.decode.search import beam_search
from attnlab.errors import UsageError
from attnlab.files import atomic_write_text
from attnlab.nn.interfaces import Classifier
from attnlab.runs.checkpoint import load_run
from attnlab.runs.data import read_run_data
from attnlab.runs.run_dir import RunDir
from attnlab.tasks import Analysed, ClassificationConfig, EncoderConfig, MaskedLMConfig
from attnlab.tasks.classification import encode_inputs

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
FigureDir = Callable[[], Path]  # called once the input has been read: the folder the figures go to


def figure_dir(out: str | Path | None, run_dir: str | Path, source: str, force: bool = False) -> Path:
    """The folder one `inspect` writes, made here: ``out`` (refused when it already holds files,
    unless ``force``), or by default a new one in RUN_DIR/inspect named N-WORDS: N one more than
    the highest number there, WORDS the input's first words (an image's file name), so that each
    call keeps its own figures."""
    if out is not None:
        out = Path(out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} is a file; give a folder for the figures")
        if out.is_dir() and any(out.iterdir()) and not force:
            raise UsageError(
                f"{out} already exists; pass --force to overwrite its figures, or choose another --out "
                f"(without --out, each call writes a new folder in RUN_DIR/inspect)"
            )
        out.mkdir(parents=True, exist_ok=True)
        return out
    parent = Path(run_dir) / "inspect"
    stem = Path(source).stem if Path(source).suffix.lower() in IMAGE_SUFFIXES else source
    words = re.sub(r"\W+", "-", stem).strip("-")[:40].strip("-") or "input"
    taken = [int(m[1]) for p in parent.iterdir() if (m := re.match(r"(\d+)-", p.name))] if parent.is_dir() else []
    number = max(taken, default=0) + 1
    while True:  # another call may take a number between the listing and the mkdir
        folder = parent / f"{number}-{words}"
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            number += 1


@torch.no_grad()
def entropy_over_split(
    run_dir: str | Path, split: str = "valid", checkpoint: str = "best", device: torch.device | str = "cpu"
) -> dict[str, list[float]]:
    """Each module's mean attention entropy per head (nats) over a split of the run's data,
    teacher-forced, padding queries excluded: {module: [H values]}."""
    model, _, _ = load_run(run_dir, checkpoint, device)
    run = RunDir(run_dir)
    task = run.read_config()[1].task
    if not isinstance(task, Analysed):
        raise UsageError(
            f"{run_dir} is a run of data.task '{task.name}', which has no validation pass whose attention "
            f"`inspect --split` reads"
        )
    data = read_run_data(run, split)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, float] = {}
    model.eval()
    for batch in data.eval_batches(split):
        with capture_attention(model) as captured:
            queries = task.analysis_pass(model, batch.to(device))
        for name, record in captured.last().items():
            valid = queries[record.stack]
            n = float(valid.sum())
            sums[name] = sums.get(name, 0) + head_entropy(record.probs, valid) * n
            counts[name] = counts.get(name, 0.0) + n
    return {name: [round(float(e), 4) for e in sums[name] / counts[name]] for name in sums}


def module_entry(record: AttentionRecord, entropy: torch.Tensor) -> dict[str, Any]:
    """One attention module on one sentence, for summary.json: each head's ``entropy`` (nats; and a
    uniform head's), and for self-attention each head's mean distance to the keys it attends to."""
    Tq, Tk = record.probs.shape[-2:]
    entry = {
        "stack": record.stack,
        "layer": record.layer,
        "kind": record.kind,
        "heads": record.probs.shape[1],
        "entropy": [round(float(e), 4) for e in entropy],
        "uniform_entropy": round(math.log(Tk), 4),
    }
    if record.kind == "self":
        q_pos, k_pos = (torch.arange(n, device=record.probs.device) for n in (Tq, Tk))
        entry["mean_distance"] = [round(float(d), 3) for d in mean_distance(record.probs, q_pos, k_pos)]
    return entry


@torch.no_grad()
def inspect_encoder(
    run: RunDir, model: nn.Module, tokenizer: Tokenizer, text: str, figures: FigureDir, with_prediction: bool
) -> dict[str, Any]:
    """An encoder-only model on ``text`` (``a TAB b``: a sentence pair), encoded as its task reads
    input: every layer's maps, the attention of [CLS] per layer and head, and ``with_prediction``
    a classifier's prediction."""
    _, data_cfg, _ = run.read_config()
    a, _, b = text.partition("\t")
    section = cast("ClassificationConfig | MaskedLMConfig | EncoderConfig", data_cfg)  # an encoder-only run's
    longest = section.truncation.max_len
    inputs, _ = encode_inputs(tokenizer, [a], [b if "\t" in text else None], longest)
    ids, segments = inputs[0]  # <bos> a <eos> [b <eos>], segments 0 / 1
    device = next(model.parameters()).device
    ids_t, segments_t = torch.tensor([ids], device=device), torch.tensor([segments], device=device)
    model.eval()
    with capture_attention(model) as captured:
        logits = cast(Classifier, model).classify(ids_t, segments_t)  # read only with_prediction
    records = captured.last()
    out = figures()
    labels = tokenizer.id_tokens(ids)
    summary: dict[str, Any] = {
        "run": str(run.path),
        "source": text,
        "source_tokens": labels,
        "modules": {},
        "out": str(out),
        "files": [],
    }
    if with_prediction:
        p = logits[0].softmax(-1)
        names = run.read_task_state()["labels"]
        summary["prediction"] = {"label": names[int(p.argmax())], "probabilities": dict(zip(names, p.tolist()))}
    entropies, first = {}, []
    for name, record in records.items():
        entropies[name] = head_entropy(record.probs)
        summary["modules"][name] = module_entry(record, entropies[name]) | {
            "first_token": [[round(float(w), 4) for w in head] for head in record.probs[0, :, 0]]
        }
        first.append(record.probs[0, :, 0])  # (H, T): what [CLS] attends to
        summary["files"].append(
            str(
                attention_heatmaps(
                    record.probs[0], labels, labels, name, out / f"{record.stack}-{record.layer}-{record.kind}.png"
                )
            )
        )
    rows = [f"layer {r.layer} head {h}" for r in records.values() for h in range(r.probs.shape[1])]
    summary["files"].append(str(first_token_plot(torch.cat(first), rows, labels, out / "first-token.png")))
    summary["files"].append(str(entropy_plot(entropies, out / "entropy.png")))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary


@torch.no_grad()
def inspect_sequence(
    run_dir: str | Path,
    model: nn.Module,
    tokenizers: dict[str, Tokenizer],
    cfg: Any,
    text: str,
    target: str | None,
    beam: int,
    figures: FigureDir,
) -> dict[str, Any]:
    """A model that predicts tokens on ``text``: an encoder-decoder's source, translated by beam search
    (or read against ``target``), or a language model's text, read alone; the figures and
    summary.json of the module docstring."""
    device = next(model.parameters()).device
    seq2seq = cfg.capabilities.encoder
    tok_in = tokenizers["src"] if seq2seq else tokenizers["tgt"]
    ids = tok_in.encode(text)
    if not ids:
        raise UsageError("--src is empty after tokenisation; give at least one known token")
    src = source_batch([ids]).to(device) if seq2seq else None
    if not seq2seq:
        tgt_ids, tgt_in = ids, torch.tensor([ids])
    elif target is not None:
        tgt_ids = tokenizers["tgt"].encode(target)
        tgt_in = torch.tensor([[BOS] + tgt_ids])
    else:
        tgt_ids = beam_search(model, src, beam=beam)[0][0].tokens
        tgt_in = torch.tensor([[BOS] + tgt_ids])
    records = attention_of(model, src, tgt_in.to(device))
    out = figures()
    src_labels = tok_in.id_tokens(cast(Tensor, src)[0].tolist()) if seq2seq else None  # src: a seq2seq model's
    in_labels = tokenizers["tgt"].id_tokens(tgt_in[0].tolist())  # decoder inputs (queries)
    out_labels = tokenizers["tgt"].id_tokens(tgt_ids + ([EOS] if seq2seq else []))  # what each query predicts
    summary: dict[str, Any] = {
        "run": str(run_dir),
        "source": text,
        "source_tokens": src_labels,
        "target": tokenizers["tgt"].decode(tgt_ids),
        "target_tokens": out_labels,
        "target_given": target is not None,
        "modules": {},
        "out": str(out),
        "files": [],
    }
    entropies = {}
    for name, record in records.items():
        probs = record.probs[0]  # (H, Tq, Tk)
        if not seq2seq or (record.stack, record.kind) == ("decoder", "self"):
            rows = cols = in_labels
        elif record.stack == "encoder":
            rows = cols = cast(list[str], src_labels)  # a seq2seq model's, as below
        else:  # cross-attention: the token each query predicts, against the source
            rows, cols = out_labels, cast(list[str], src_labels)
        entropies[name] = head_entropy(record.probs)
        summary["modules"][name] = module_entry(record, entropies[name])
        stem = f"{record.stack}-{record.layer}-{record.kind}"
        summary["files"].append(str(attention_heatmaps(probs, rows, cols, f"{name} ({cfg.arch})", out / f"{stem}.png")))
        if record.kind == "cross":
            summary["files"].append(
                str(
                    alignment_plot(
                        probs.mean(0), cols, rows, f"{name}: alignment, heads averaged", out / f"{stem}-alignment.png"
                    )
                )
            )
    summary["files"].append(str(entropy_plot(entropies, out / "entropy.png")))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return summary
