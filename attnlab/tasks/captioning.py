"""Image captioning: an image to a sentence, trained by teacher forcing on captioned images
(tasks/captions.py: the built-in scenes or captions files, their standardisation and batches).
Validation adds the exact match of greedy captions; `attnlab evaluate --split NAME` (or ``--data
FILE``, a captions file) gives exact match and sacrebleu's BLEU of the captions, by greedy or beam
search (``--beam``, ``--lenpen``), and the references' perplexity; `attnlab caption RUN image.png`
decodes by greedy or beam search with the KV cache.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from attnlab.data.batching import Batch
from attnlab.data.images import Standardise, as_tensor, colour_of
from attnlab.data.tokenizers import PAD, Tokenizer
from attnlab.decode.spec import Greedy, Search
from attnlab.eval.likelihood import evaluate as teacher_forced
from attnlab.eval.metrics import corpus_bleu, exact_match
from attnlab.tasks.abilities import DecodesBySearch
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.captions import (
    CaptionBatch,
    CaptionData,
    CaptionedImages,
    caption_batch,
    captioned_splits,
    read_captioned,
)
from attnlab.tasks.captions_section import CaptioningConfig
from attnlab.tasks.task import Amp, NextTokenTask, register_task

if TYPE_CHECKING:
    from attnlab.nn.captioner import ImageCaptioner

# -- decoding and scoring -------------------------------------------------------------------------------


@torch.no_grad()
def caption_images(
    model: nn.Module, tokenizer: Tokenizer, images: Tensor, search: Search
) -> list[list[tuple[str, float | None]]]:
    """(N, C, H, W) standardised images -> each one's captions by ``search`` (decode/spec.py: greedy's
    unscored, beam search's ``nbest`` scored log P / length penalty), ``search.batch_size`` at a time."""
    model.eval()
    device = next(model.parameters()).device
    return [
        [(tokenizer.decode(ids), score) for ids, score in outputs]
        for chunk in torch.split(images, search.batch_size)
        for outputs in search.decode(model, chunk.to(device))
    ]


def caption_record(
    model: nn.Module, tokenizer: Tokenizer, images: Tensor, references: list[str], search: Search
) -> dict[str, Any]:
    """Exact match and BLEU (sacrebleu, with its signature) of the captions of ``images`` (standardised)
    by ``search`` against ``references``, and the references' teacher-forced perplexity."""
    hypotheses = [nbest[0][0] for nbest in caption_images(model, tokenizer, images, search)]
    bleu, signature = corpus_bleu(hypotheses, references)
    ids = tokenizer.encode_batch(references)
    batches: list[Batch] = [caption_batch(images[i : i + 64], ids[i : i + 64]) for i in range(0, len(ids), 64)]
    likelihood = teacher_forced(model, batches)
    return {
        "exact_match": exact_match(hypotheses, references),
        "bleu": bleu,
        "bleu_signature": signature,
        "ppl": likelihood["ppl"],
        "nll": likelihood["loss"],
        "images": len(references),
        **search.record(),
        "examples": [{"reference": r, "caption": h} for r, h in list(zip(references, hypotheses))[:5]],
    }


@register_task
class Captioning(DecodesBySearch, NextTokenTask[CaptionData, CaptionBatch], CaptionedImages[CaptionData, CaptionBatch]):
    """A caption generated for each image (data.task: captioning), scored by loss, perplexity and exact
    match."""

    name = "captioning"
    config = CaptioningConfig
    needs = {"inputs": "images", "encoder": True, "decoder": True}
    metrics = {"valid_loss": True, "valid_ppl": True, "exact_match": False}
    commands = ("caption", "evaluate", "inspect")
    cfg: CaptioningConfig

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> CaptionData:
        splits, tokenizers, standardise = captioned_splits(self.cfg, tokenizers, state)
        return CaptionData(
            splits=splits,
            tokenizers=tokenizers,
            standardise=standardise,
            batch_size=batching.batch_size,
            max_caption_len=self.cfg.captions.max_caption_len,
            seed=batching.seed,
        )

    def validate(
        self, model: nn.Module, data: CaptionData, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        """Loss and perplexity, and the exact match of ``n_decoded`` greedy captions."""
        result = super().validate(model, data, device, amp, n_decoded, split)
        if n_decoded:
            part = data.splits[split]
            images = data.standardise(part.images[:n_decoded])
            hypotheses = [
                c[0][0]
                for c in caption_images(
                    model, cast(Tokenizer, data.tokenizers["tgt"]), images, Greedy(max_len=data.max_caption_len)
                )
            ]
            result["exact_match"] = exact_match(hypotheses, part.captions[:n_decoded])
        return result

    def analysis_pass(self, model: nn.Module, batch: CaptionBatch) -> dict[str, Tensor]:
        captioner = cast("ImageCaptioner", model)  # the task's model
        memory, valid = captioner.encode(cast(Tensor, batch.src))  # a caption batch's src: its images
        captioner.decode(batch.tgt_in, memory, valid)
        return {"encoder": valid, "decoder": batch.tgt_in != PAD}

    def evaluate_split(self, model: nn.Module, data: CaptionData, split: str) -> dict[str, Any]:
        """Captions of a split of the run's data by the task's search, at most the run's
        max_caption_len tokens each, scored."""
        part = data.splits[split]
        return caption_record(
            model,
            cast(Tokenizer, data.tokenizers["tgt"]),  # the task's own role: never None
            data.standardise(part.images),
            part.captions,
            replace(self.search, max_len=data.max_caption_len),
        )

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """Captions of a captions file's images, read as the run's training images were, by the task's search,
        scored."""
        self.refuse_split(split)
        shape = tuple(state["shape"])
        pixels, captions = read_captioned(path, colour_of(shape), self.cfg.images.resize or shape[:2])
        images = Standardise(state["mean"], state["std"])(as_tensor(pixels))
        search = replace(self.search, max_len=self.cfg.captions.max_caption_len)
        return caption_record(
            model, cast(Tokenizer, tokenizers["tgt"]), images, captions, search
        )  # the task's own role: never None

    def report(self, result: dict[str, Any], source: str) -> list[str]:
        search = "greedy" if result["beam"] == 1 else f"beam {result['beam']}, lenpen {result['lenpen']}"
        lines = [
            f"exact match  {result['exact_match']:.2%}   BLEU  {result['bleu']:.2f}   perplexity of the references  "
            f"{result['ppl']:.3f}   ({result['images']} images, {source}, {search})",
            f"BLEU signature  {result['bleu_signature']}",
        ]
        return lines + [f"  {e['caption']}   (reference: {e['reference']})" for e in result["examples"]]
