"""Masked language modelling (BERT's pre-training): lines of plain text, of which about
``mask_prob`` of the tokens are chosen and, of those, 80% replaced by <mask>, 10% by a random
token and 10% kept; the encoder predicts the chosen ones. Validated by the NLL per masked token,
its perplexity and the masked-token accuracy; used by `fill-mask`."""

from __future__ import annotations

import typing
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnlab.config import flattened
from attnlab.data.batching import moved, pad_sequences
from attnlab.data.corpora import read_lines
from attnlab.data.tokenizers import BOS, EOS, MASK, PAD, Tokenizer
from attnlab.errors import ConfigError, DataError
from attnlab.eval.metrics import perplexity
from attnlab.nn.losses import label_smoothed_nll
from attnlab.tasks.abilities import Piped
from attnlab.tasks.batching import Batching, BucketedData, Tokenizers, hold_out_valid
from attnlab.tasks.parts import Files, Splits, Text, Truncation
from attnlab.tasks.task import Amp, Task, TaskConfig, register_task

N_SPECIALS = MASK + 1  # <pad> <bos> <eos> <unk> <mask>: a random replacement is never one of them


@dataclass(frozen=True)
class MaskedLMConfig(TaskConfig):
    """Lines of plain text (blank lines skipped), each one example of at most ``max_len`` tokens
    with <bos> and <eos> (Truncation, written flat); without a ``valid`` file the last
    ``splits.n_valid`` lines are held out.
    ``whole_word``: choose words, and mask all the pieces of a chosen word together."""

    files: Files = flattened(Files(), ("train", "valid"))
    text: Text = Text()
    truncation: Truncation = flattened(Truncation(max_len=128))
    splits: Splits = Splits(n_valid=500)
    splits_read = ("n_valid",)
    mask_prob: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    whole_word: bool = False

    def check(self) -> None:
        self.splits.read_by(self.chosen_name(), self.splits_read)
        self.splits.given(*self.splits_read)
        if not 0.0 < self.mask_prob < 1.0:
            raise ConfigError(f"mask_prob must be in (0, 1) (got {self.mask_prob})")
        if min(self.mask_token_prob, self.random_token_prob) < 0 or self.mask_token_prob + self.random_token_prob > 1:
            raise ConfigError(
                f"mask_token_prob ({self.mask_token_prob}) and random_token_prob "
                f"({self.random_token_prob}) must be >= 0 and sum to at most 1 (the rest is kept)"
            )

    def check_trainable(self) -> None:
        """A run imported from Hugging Face (interop/) has no training text; training needs one."""
        if self.files.train is None:
            raise ConfigError("data.task 'masked_lm' needs 'train' (a text file)")

    @property
    def longest_sequence(self) -> int:
        return self.truncation.max_len


@dataclass
class MLMBatch:
    """inputs: (B, T) ids after masking; targets: (B, T) the original id where a token was chosen,
    PAD elsewhere (not predicted)."""

    inputs: Tensor
    targets: Tensor

    @property
    def n_targets(self) -> int:
        return int((self.targets != PAD).sum())

    def to(self, device: torch.device | str) -> "MLMBatch":
        return moved(self, device)


def mask_tokens(
    ids: Tensor, word_starts: Tensor, cfg: MaskedLMConfig, vocab_size: int, generator: torch.Generator
) -> MLMBatch:
    """BERT's masking of (B, T) ``ids``: each real token (never <pad>, <bos>, <eos>) is chosen with
    probability mask_prob (with whole_word, each word, all its pieces with it; ``word_starts``
    (B, T) marks the first piece of each word); a chosen token becomes <mask> with probability
    mask_token_prob, a random non-special token with random_token_prob, else stays."""
    maskable = (ids != PAD) & (ids != BOS) & (ids != EOS)
    draw = torch.rand(ids.shape, generator=generator)
    if cfg.whole_word:  # a word's draw is its first piece's, carried along the pieces that follow
        first = torch.where(word_starts, torch.arange(ids.shape[1]).expand_as(ids), 0).cummax(dim=1).values  # (B, T)
        draw = draw.gather(1, first)
    chosen = maskable & (draw < cfg.mask_prob)
    how = torch.rand(ids.shape, generator=generator)
    random_ids = torch.randint(N_SPECIALS, vocab_size, ids.shape, generator=generator)
    inputs = torch.where(chosen & (how < cfg.mask_token_prob), MASK, ids)
    replaced = chosen & (how >= cfg.mask_token_prob) & (how < cfg.mask_token_prob + cfg.random_token_prob)
    inputs = torch.where(replaced, random_ids, inputs)
    return MLMBatch(inputs, torch.where(chosen, ids, PAD))


Line = tuple[list[int], list[bool]]  # ids with <bos>/<eos>, and which of them begin a word


@dataclass(kw_only=True)
class MLMData(BucketedData[Line, MLMBatch]):
    """Encoded lines per split; each batch masked from its own seed, so the evaluation batches,
    made once, keep their masks."""

    splits: dict[str, list[Line]]
    cfg: MaskedLMConfig

    def length(self, example: Line) -> int:
        return len(example[0])

    def collate(self, examples: list[Line], seed: int) -> MLMBatch:
        ids = pad_sequences([e[0] for e in examples])
        starts = pad_sequences([[int(s) for s in e[1]] for e in examples]).bool()
        return mask_tokens(
            ids,
            starts,
            self.cfg,
            typing.cast(Tokenizer, self.tokenizers["src"]).vocab_size,  # the task's own role: never None
            torch.Generator().manual_seed(seed),
        )


def encode_lines(tokenizer: Tokenizer, lines: list[str], max_len: int) -> list[Line]:
    """<bos> ids <eos>, cut to max_len, and which tokens begin a word (the specials do)."""
    out = []
    for line, ids in zip(lines, tokenizer.encode_batch(lines)):
        starts = tokenizer.word_starts(line)
        ids, starts = ids[: max_len - 2], starts[: max_len - 2]
        out.append(([BOS, *ids, EOS], [True, *starts, True]))
    return out


def text_lines(path: str) -> list[str]:
    """The file's non-blank lines (read and checked as every corpus is)."""
    lines = [line for line in read_lines(path, allow_empty=True) if line.strip()]
    if not lines:
        raise DataError(f"{path}: no text (only blank lines)")
    return lines


@register_task
class MaskedLM(Task[MLMData, MLMBatch]):
    """BERT's masked language model (data.task: masked_lm): some tokens hidden, the encoder predicts them;
    scored by loss, perplexity and masked-token accuracy."""

    name = "masked_lm"
    config = MaskedLMConfig
    needs = {"encoder": True, "decoder": False}
    metrics = {"valid_loss": True, "valid_ppl": True, "masked_accuracy": False}
    commands = ("fill-mask", "inspect", "prune")
    tokenizers = ("src",)
    untrained = ("classifier.",)
    pipeline_head = "forward"
    cfg: MaskedLMConfig

    def piped(self, batch: MLMBatch) -> Piped:
        return Piped((batch.inputs,), batch.targets, PAD)

    def prepare(
        self, batching: Batching, tokenizers: Tokenizers | None = None, state: dict[str, typing.Any] | None = None
    ) -> MLMData:
        cfg = self.cfg
        files = dict(cfg.files.given())
        lines = hold_out_valid(
            {name: text_lines(path) for name, path in files.items()},
            cfg.splits.n_valid or 0,  # given: MaskedLMConfig.check
            cfg.files.train,
            "lines",
            "splits.n_valid",
        )
        if tokenizers is None:
            tokenizers = {
                "src": cfg.text.fitted(lines["train"], with_mask=True),
                "tgt": None,
            }
        src = typing.cast(Tokenizer, tokenizers["src"])  # the task's own role: never None
        splits = {name: encode_lines(src, text, cfg.truncation.max_len) for name, text in lines.items()}
        return MLMData(tokenizers=tokenizers, splits=splits, cfg=cfg, **batching.bucketing())

    def loss(self, model: nn.Module, batch: MLMBatch, label_smoothing: float, amp: Amp) -> tuple[Tensor, Tensor]:
        with amp():
            logits = model(batch.inputs)
        return label_smoothed_nll(logits, batch.targets, label_smoothing, PAD)

    @torch.no_grad()
    def validate(
        self, model: nn.Module, data: MLMData, device: torch.device, amp: Amp, n_decoded: int, split: str = "valid"
    ) -> dict[str, float]:
        model.eval()
        nll, right, n = 0.0, 0, 0
        for batch in data.eval_batches(split):
            batch = batch.to(device)
            with amp():
                logits = model(batch.inputs)
            nll += label_smoothed_nll(logits, batch.targets, 0.0, PAD)[1].item()
            chosen = batch.targets != PAD
            right += int((logits.argmax(-1)[chosen] == batch.targets[chosen]).sum())
            n += int(chosen.sum())
        loss = nll / max(n, 1)
        return {"valid_loss": loss, "valid_ppl": perplexity(loss), "masked_accuracy": right / max(n, 1)}

    def analysis_pass(self, model: nn.Module, batch: MLMBatch) -> dict[str, Tensor]:
        model(batch.inputs)
        return {"encoder": batch.inputs != PAD}

    def describe(self, data: MLMData) -> str:
        sizes = ", ".join(f"{name} {len(e):,} lines" for name, e in data.splits.items())
        masked = sum(b.n_targets for b in data.eval_batches("valid"))
        vocabulary = typing.cast(Tokenizer, data.tokenizers["src"]).vocab_size  # the task's own role: never None
        return f"masked-LM text: {sizes}; vocabulary {vocabulary}; {masked:,} valid tokens masked"


@torch.no_grad()
def fill_mask(
    model: nn.Module, tokenizer: Tokenizer, text: str, top_k: int, marker: str = "[MASK]"
) -> list[list[tuple[str, float]]]:
    """The ``top_k`` fillers of each ``marker`` in ``text``, with their probabilities."""
    pieces = text.split(marker)
    if len(pieces) == 1:
        raise DataError(f"the text has no {marker} to fill: {text!r}")
    ids = [BOS]
    for i, piece in enumerate(pieces):
        ids += tokenizer.encode(piece) + ([MASK] if i < len(pieces) - 1 else [])
    ids.append(EOS)
    model.eval()
    device = next(model.parameters()).device
    logits = model(torch.tensor([ids], device=device))[0].float()  # (T, V)
    probs = logits[torch.tensor(ids, device=device) == MASK].softmax(-1)  # (masks, V)
    probs[:, :N_SPECIALS] = 0.0  # a filler is a word, not a control symbol
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    return [
        [(tokenizer.id_tokens([i])[0], p) for i, p in zip(row_ids.tolist(), row_p.tolist())]
        for row_ids, row_p in zip(top.indices, top.values)
    ]
