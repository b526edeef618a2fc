"""What a dual encoder (nn/dual_encoder.py) is measured by: image <-> text retrieval (recall@k over
a split's distinct captions) and CLIP's zero-shot classification (each class named by prompts,
their text embeddings averaged: CLIP's prompt ensembling).

Retrieval: every image of a split is a query over the split's distinct captions (a caption that
several images share is one entry of the gallery), and every distinct caption a query over the
images; a query is answered at k when any of the k most similar entries is one it should find
(image -> text: its caption; text -> image: any image with that caption).

Zero-shot classification: class c's embedding is the normalised mean of the unit embeddings of
its prompts (each template filled with the class name), the class probabilities softmax(exp(t)
cos(image, class)). An image is labelled for the accuracy where its caption is one of the
prompts: with the scenes' templates "a small {label}" and "a large {label}", every scene of one
object, whose caption is such a prompt.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnlab.data.batching import pad_sequences
from attnlab.data.tokenizers import BOS, EOS, Tokenizer

if TYPE_CHECKING:
    from attnlab.nn.dual_encoder import DualEncoder

CHUNK = 256  # images or texts per forward when embedding a split


def text_ids(ids: list[list[int]]) -> Tensor:
    """Caption ids -> (B, T): BOS caption EOS, PAD-padded (the text tower's input)."""
    return pad_sequences([[BOS] + row + [EOS] for row in ids])


def recall_at_k(similarity: Tensor, relevant: Tensor, k: int) -> float:
    """(Q, G) similarities of each query to each gallery entry and (Q, G) booleans (the entry is one
    the query should find) -> the fraction of queries with a relevant entry among their k most
    similar."""
    top = similarity.topk(min(k, similarity.shape[1]), dim=1).indices  # (Q, k)
    return relevant.gather(1, top).any(1).float().mean().item()


@torch.no_grad()
def embed_images(model: nn.Module, images: Tensor) -> Tensor:
    """(N, C, H, W) standardised -> (N, d_embed) unit vectors."""
    model.eval()
    device = next(model.parameters()).device
    # the model: the contrastive task's dual encoder
    return torch.cat(
        [
            cast("DualEncoder", model).encode_image(chunk.to(device)).float().cpu()
            for chunk in torch.split(images, CHUNK)
        ]
    )


@torch.no_grad()
def embed_texts(model: nn.Module, ids: list[list[int]]) -> Tensor:
    """Caption ids -> (M, d_embed) unit vectors."""
    model.eval()
    device = next(model.parameters()).device
    return torch.cat(  # the model: the contrastive task's dual encoder
        [
            cast("DualEncoder", model).encode_text(text_ids(ids[i : i + CHUNK]).to(device)).float().cpu()
            for i in range(0, len(ids), CHUNK)
        ]
    )


def retrieval_scores(image_embeddings: Tensor, text_embeddings: Tensor, caption_of: Tensor) -> dict[str, float]:
    """(N, d) images, (M, d) distinct captions and (N,) the index of each image's caption ->
    recall@1 and @5 of image -> text and text -> image."""
    similarity = image_embeddings @ text_embeddings.T  # (N, M): cosines
    relevant = caption_of[:, None] == torch.arange(len(text_embeddings))[None]  # (N, M)
    return {
        f"{direction}_r{k}": recall_at_k(s, r, k)
        for k in (1, 5)
        for direction, s, r in (("image_to_text", similarity, relevant), ("text_to_image", similarity.T, relevant.T))
    }


def class_embeddings(model: nn.Module, tokenizer: Tokenizer, labels: list[str], templates: list[str]) -> Tensor:
    """(C, d_embed): each class's prompts embedded, averaged and normalised again."""
    prompts = [template.format(label=label) for label in labels for template in templates]
    embedded = torch.unflatten(embed_texts(model, tokenizer.encode_batch(prompts)), 0, (len(labels), len(templates)))
    return F.normalize(embedded.mean(1), dim=-1)  # (C, T, d) -> (C, d)


@torch.no_grad()
def zero_shot_probabilities(model: nn.Module, image_embeddings: Tensor, classes: Tensor) -> Tensor:
    """(N, d) images and (C, d) class embeddings -> (N, C) softmax(exp(t) cos(image, class))."""
    # the model: the contrastive task's dual encoder
    return (cast("DualEncoder", model).logit_scale.float().cpu() * image_embeddings @ classes.T).softmax(-1)


def labelled_by_prompt(captions: list[str], labels: list[str], templates: list[str]) -> dict[int, int]:
    """{image index: class index} for the images whose caption is one of the classes' prompts."""
    class_of = {template.format(label=label): c for c, label in enumerate(labels) for template in templates}
    return {i: class_of[caption] for i, caption in enumerate(captions) if caption in class_of}


def retrieval_record(
    model: nn.Module, tokenizer: Tokenizer, images: Tensor, captions: list[str], labels: list[str], templates: list[str]
) -> dict[str, Any]:
    """Recall@1/5 both ways over ``images`` (standardised) and their ``captions``, and the zero-shot
    accuracy of ``labels`` (with ``templates``) over the images that a prompt captions."""
    distinct = list(dict.fromkeys(captions))
    index = {caption: m for m, caption in enumerate(distinct)}
    image_embeddings = embed_images(model, images)
    record: dict[str, Any] = retrieval_scores(
        image_embeddings,
        embed_texts(model, tokenizer.encode_batch(distinct)),
        torch.tensor([index[c] for c in captions]),
    )
    record |= {"images": len(captions), "captions": len(distinct)}
    labelled = labelled_by_prompt(captions, labels, templates) if labels else {}
    record |= {"zero_shot_images": len(labelled), "zero_shot_classes": len(labels)}
    if labelled:
        rows = torch.tensor(list(labelled))
        probabilities = zero_shot_probabilities(
            model, image_embeddings[rows], class_embeddings(model, tokenizer, labels, templates)
        )
        predicted, gold = probabilities.argmax(-1).tolist(), list(labelled.values())
        record["zero_shot_accuracy"] = sum(p == g for p, g in zip(predicted, gold)) / len(gold)
        errors = Counter((labels[g], labels[p]) for p, g in zip(predicted, gold) if p != g)
        record["zero_shot_errors"] = [{"label": g, "predicted": p, "images": n} for (g, p), n in errors.most_common(3)]
    return record
