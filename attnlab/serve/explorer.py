"""The model side of `attnlab serve`: one trained run, asked one input at a time.

An :class:`Explorer` loads a run once and answers :meth:`Explorer.run` requests (plain dicts, as
the JSON API receives them) with the run's output and every attention map that produced it:

- translation: the beam's n-best with scores; the maps are those of one teacher-forced pass over
  the chosen hypothesis (:func:`attnlab.analysis.capture.attention_of`'s pass), whose per-token
  log-probabilities add up to the hypothesis's score;
- language model: a greedy or sampled continuation of the prompt, the maps over prompt + continuation;
- classifier (and masked LM, maps only): the text read as its task reads it;
- image model, captioner and question answerer: an uploaded image (``image``: its file's bytes in
  base64), or an image file on the server (``text``: its path) when the server allows files, read
  as `predict`, `caption` and `ask` read them; a captioner answers as a translation does, with the
  picture as the model read it and the patch grid, over which the page draws each word's
  cross-attention; a single-stream model answers the ``question`` about the image as `ask` does,
  with the maps over the joint sequence [question; patches] and each layer's text-to-image block
  (analysis/cross_modal.py), which the page draws on the picture for each word and the [CLS].

Heads named in ``heads_off`` are gated to zero for that request alone (:func:`mask_heads`), which
computes what the model with those heads cut out of its weights computes (``remove_heads``).
Requests share one model, so they run one at a time.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import Tensor

from attnlab.analysis.capture import AttentionRecord, capture_attention
from attnlab.analysis.cross_modal import blocks, cross_modal_pass
from attnlab.analysis.heads import head_entropy, mask_heads
from attnlab.data.batching import source_batch
from attnlab.data.tokenizers import BOS, EOS
from attnlab.decode.search import beam_search, sample
from attnlab.errors import UsageError
from attnlab.nn.attention import HeadSet, attention_modules
from attnlab.nn.single_stream import IMAGE
from attnlab.serve.images import IMAGE_READERS, request_image
from attnlab.serve.limits import LIMITS, Refused
from attnlab.serve.runinfo import example_input, pruning_report
from attnlab.tasks.classification import encode_inputs
from attnlab.tasks.visual_qa import question_ids
from attnlab.runs.checkpoint import load_run
from attnlab.runs.run_dir import RunDir


# The fields each kind of run reads from a request, with their defaults; "run" picks the explorer.
COMMON = {"run": 0, "text": "", "heads_off": {}}
SEARCH = {"beam": 4, "lenpen": 0.6, "hypothesis": 0}
FIELDS = {
    "translation": SEARCH,
    "language_model": {"max_new_tokens": 20, "sample": False, "temperature": 1.0, "seed": 0},
    "classification": {},
    "masked_lm": {},
    "encoder": {},  # an imported BertModel: its maps alone, as a masked LM's (served by _encoder)
    "image_classification": {"image": ""},
    "captioning": {"image": "", **SEARCH},
    "visual_qa": {"image": "", "question": ""},
}


class Explorer:
    """One run's model, loaded once; :meth:`run` answers a request, :meth:`info` describes the run."""

    def __init__(self, run_dir: str | Path, checkpoint: str = "best", device: torch.device | str = "cpu",
                 allow_files: bool = False) -> None:
        self.run_dir = RunDir(run_dir)
        self.name = self.run_dir.path.name
        model_cfg, self.data_cfg, _ = self.run_dir.read_config()  # "not a run directory" comes from here
        self.task = self.data_cfg.task.name
        if self.task not in FIELDS or not (model_cfg.capabilities.attention_weights or model_cfg.capabilities.decoder):
            raise UsageError(f"{run_dir} is a run of data.task '{self.task}' with arch '{model_cfg.arch}'; "
                             f"`attnlab serve` explores runs with attention of data.task "
                             f"{', '.join(map(repr, FIELDS))}")
        self.model, self.tokenizers, self.cfg = load_run(run_dir, checkpoint, device)
        try:  # a backend that forms no weights ('local', 'sparse', 'linear') is refused now, not per request
            with capture_attention(self.model):
                pass
        except ValueError as err:
            raise UsageError(f"{run_dir}: {err}") from None
        self.device = next(self.model.parameters()).device
        self.allow_files = allow_files
        self.lock = threading.Lock()
        self.example = example_input(self.run_dir, self.task, self.tokenizers)

    def info(self) -> dict[str, Any]:
        """The run as the page shows it: name, family, task, input kind, maskable modules, pruning."""
        return {"path": str(self.run_dir.path), "name": self.name, "arch": self.cfg.arch,
                "task": self.task, "input": "image" if self.task in IMAGE_READERS else "text",
                "files_allowed": self.allow_files, "options": FIELDS[self.task],
                "modules": {name: m.n_heads for name, m in attention_modules(self.model).items()},
                "pruning": pruning_report(self.run_dir), "example": self.example}

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one request: {text, heads_off: {module: [heads]}, and the task's FIELDS}."""
        options = self._options(request)
        text = options.pop("text")
        heads_off = self._heads(options.pop("heads_off"))
        answer = getattr(self, f"_{self.task}")
        with self.lock, self._masked(heads_off), torch.no_grad():
            result = answer(text, **options)
        return {"run": self.name, "task": self.task, "heads_off": heads_off, **result}

    # -- reading a request ------------------------------------------------------------------------
    def _options(self, request: dict[str, Any]) -> dict[str, Any]:
        """The request's fields, checked, with the task's defaults filled in ("run" dropped)."""
        fields = COMMON | FIELDS[self.task]
        if "question" in request and "question" not in fields:
            raise Refused(f"{self.name} is a {self.task} run, which answers no question; ask a visual_qa run")
        unknown = sorted(set(request) - set(fields))
        if unknown:
            raise Refused(f"unknown field {unknown[0]!r}; a {self.task} run reads {', '.join(fields)}")
        options = {name: request.get(name, default) for name, default in fields.items() if name != "run"}
        for name, value in options.items():
            kind = type(fields[name])
            if kind is float and type(value) is int:
                value = options[name] = float(value)
            if type(value) is not kind:
                raise Refused(f"{name} must be {kind.__name__ if kind is not dict else 'an object'} "
                              f"(got {json.dumps(value)})")
        if len(options["text"]) > LIMITS.max_chars:
            raise Refused(f"the input has {len(options['text']):,} characters; the explorer takes at most "
                          f"{LIMITS.max_chars:,}", status=413)
        if self.task in IMAGE_READERS and options["text"].strip() and options["image"]:
            raise Refused("give an uploaded image or an image file's path, not both")
        if self.task in IMAGE_READERS and not (options["text"].strip() or options["image"]):
            raise Refused("the input is empty; upload an image, or give an image file's path on the server")
        if self.task not in IMAGE_READERS and not options["text"].strip():
            raise Refused("the input is empty; type a sentence")
        return options

    def _heads(self, heads_off: dict[str, Any]) -> HeadSet:
        """``heads_off`` checked against the model's modules: {module: sorted head indices}."""
        modules = attention_modules(self.model)
        checked: HeadSet = {}
        for name, heads in heads_off.items():
            if name not in modules:
                raise Refused(f"heads_off: no attention module {name!r} (modules: {', '.join(modules)})")
            n = modules[name].n_heads
            if not isinstance(heads, list) or any(type(h) is not int or not 0 <= h < n for h in heads):
                raise Refused(f"heads_off[{name!r}] must be a list of head indices 0..{n - 1} (got {json.dumps(heads)})")
            if heads:
                checked[name] = sorted(set(heads))
        return checked

    @contextlib.contextmanager
    def _masked(self, heads: HeadSet) -> Iterator[None]:
        """These heads gated to zero inside the block, on the model's device; no gate after it."""
        mask_heads(self.model, heads)
        for module in attention_modules(self.model).values():
            if module.head_gate is not None:
                module.head_gate = module.head_gate.to(self.device)
        try:
            yield
        finally:
            mask_heads(self.model, {})

    def _encode(self, text: str, role: str, room: int | None) -> list[int]:
        """``text`` as token ids, refused when it is empty or longer than ``room`` tokens."""
        ids = self.tokenizers[role].encode(text)
        if not ids:
            raise Refused("the input is empty after tokenisation; give at least one known token")
        if room is not None and len(ids) > room:
            raise Refused(f"the input has {len(ids)} tokens; this model reads at most {room}", status=413)
        return ids

    @property
    def _max_len(self) -> int | None:
        """The longest sequence the model was built for (its ``max_len``), where its family has one."""
        return getattr(self.cfg, "max_len", None)

    # -- one method per task ------------------------------------------------------------------------
    def _translation(self, text: str, beam: int, lenpen: float, hypothesis: int) -> dict[str, Any]:
        ids = self._encode(text, "src", None if self._max_len is None else self._max_len - 1)  # -1: EOS
        src = source_batch([ids]).to(self.device)  # (1, S): the source and EOS
        return self._searched(src, self.tokenizers["src"].id_tokens(src[0].tolist()), beam, lenpen, hypothesis)

    def _captioning(self, text: str, image: str, beam: int, lenpen: float, hypothesis: int) -> dict[str, Any]:
        images, picture = request_image(self.task, self.run_dir, text, image, self.allow_files)
        return {**self._searched(images.to(self.device), self.cfg.patch_labels, beam, lenpen, hypothesis,
                                 self.cfg.max_len - 1), "grid": list(self.cfg.grid), "picture": picture}

    def _searched(self, src: Tensor, src_labels: list[str], beam: int, lenpen: float, hypothesis: int,
                  max_len: int | None = None) -> dict[str, Any]:
        """The beam's n-best for ``src`` (1, S) ids, or (1, C, H, W) an image, labelled ``src_labels``;
        the maps of one teacher-forced pass over the chosen hypothesis, and each of its tokens' log P."""
        if not 1 <= beam <= LIMITS.max_beam:
            raise Refused(f"beam must be between 1 and {LIMITS.max_beam} (got {beam})")
        if not 0 <= hypothesis < beam:
            raise Refused(f"hypothesis must be between 0 and beam - 1 ({beam - 1}) (got {hypothesis})")
        hyps = beam_search(self.model, src, beam=beam, lenpen=lenpen, nbest=beam, max_len=max_len)[0]
        index = min(hypothesis, len(hyps) - 1)  # a search may finish fewer than beam hypotheses
        chosen = hyps[index]
        tgt = self.tokenizers["tgt"]
        tgt_in = torch.tensor([[BOS] + chosen.tokens], device=self.device)  # (1, T): the decoder's inputs
        records, next_logprobs = self._pass(src, tgt_in)
        logprobs = picked(next_logprobs, 0, chosen.tokens + [EOS])
        in_labels = tgt.id_tokens(tgt_in[0].tolist())
        out_labels = tgt.id_tokens(chosen.tokens + [EOS])  # what each decoder position predicts
        axes = {("encoder", "self"): (src_labels, src_labels), ("decoder", "self"): (in_labels, in_labels),
                ("decoder", "cross"): (out_labels, src_labels)}
        return {"outputs": [{"text": tgt.decode(h.tokens), "tokens": tgt.id_tokens(h.tokens), "score": h.normalized,
                             "logprob": h.score} for h in hyps],
                "chosen": index, "source_tokens": src_labels, "target_tokens": out_labels,
                "steps": [{"token": token, "logprob": lp} for token, lp in zip(out_labels, logprobs)],
                "attention": attention_maps(records, lambda r: axes[r.stack, r.kind])}

    def _language_model(self, text: str, max_new_tokens: int, sample: bool, temperature: float,
                        seed: int) -> dict[str, Any]:
        if not 0 <= max_new_tokens <= LIMITS.max_new_tokens:
            raise Refused(f"max_new_tokens must be between 0 and {LIMITS.max_new_tokens} (got {max_new_tokens})")
        if temperature <= 0:
            raise Refused(f"temperature must be > 0 (got {temperature})")
        prompt = self._encode(text, "tgt", self._max_len)
        if self._max_len is not None:  # the maps cover prompt and continuation: no sliding window
            max_new_tokens = min(max_new_tokens, self._max_len - len(prompt))
        new = self._continue(prompt, max_new_tokens, sample, temperature, seed)
        ids = torch.tensor([prompt + new], device=self.device)  # (1, T)
        records, next_logprobs = self._pass(None, ids)
        logprobs = picked(next_logprobs, len(prompt) - 1, new)  # position t predicts token t + 1
        tok = self.tokenizers["tgt"]
        labels = tok.id_tokens(ids[0].tolist())
        return {"outputs": [{"text": tok.decode(new), "tokens": tok.id_tokens(new), "logprob": sum(logprobs)}],
                "chosen": 0, "prompt_tokens": labels[:len(prompt)],
                "steps": [{"token": token, "logprob": lp} for token, lp in zip(labels[len(prompt):], logprobs)],
                "attention": attention_maps(records, lambda r: (labels, labels))}

    def _continue(self, prompt: list[int], max_new_tokens: int, sampled: bool, temperature: float,
                  seed: int) -> list[int]:
        """The continuation of ``prompt``: the argmax at each step, or drawn from a generator seeded with ``seed``."""
        if max_new_tokens == 0:
            return []
        return sample(self.model, prompt=torch.tensor([prompt], device=self.device), max_new_tokens=max_new_tokens,
                      temperature=temperature if sampled else 1.0, top_k=None if sampled else 1,
                      generator=torch.Generator().manual_seed(seed))[0]

    def _classification(self, text: str) -> dict[str, Any]:
        return self._encoder(text, with_prediction=True)

    def _masked_lm(self, text: str) -> dict[str, Any]:
        return self._encoder(text, with_prediction=False)

    def _encoder(self, text: str, with_prediction: bool = False) -> dict[str, Any]:
        """An encoder-only model on ``text`` (``a TAB b``: a pair), encoded as its task reads input;
        a classifier's class probabilities ``with_prediction`` (data.task 'encoder' has no head)."""
        a, tab, b = text.partition("\t")
        [(ids, segments)], cut = encode_inputs(self.tokenizers["src"], [a], [b if tab else None], self.data_cfg.max_len)
        if cut:
            raise Refused(f"the input is longer than the {self.data_cfg.max_len} tokens this model reads", status=413)
        ids_t, segments_t = (torch.tensor([x], device=self.device) for x in (ids, segments))
        labels = self.tokenizers["src"].id_tokens(ids)
        with capture_attention(self.model) as captured:
            logits = self.model.classify(ids_t, segments_t) if with_prediction else self.model(ids_t, segments_t)
        result = {"source_tokens": labels, "attention": attention_maps(captured.last(), lambda r: (labels, labels))}
        return result | (self._probabilities(logits[0]) if with_prediction else {"outputs": []})

    def _image_classification(self, text: str, image: str) -> dict[str, Any]:
        images, _ = request_image(self.task, self.run_dir, text, image, self.allow_files)
        with capture_attention(self.model) as captured:
            logits = self.model.classify(images.to(self.device))
        records = captured.last()
        patches = self.cfg.patch_labels
        T = next(iter(records.values())).probs.shape[-1]
        labels = ["<cls>"] * (T - len(patches)) + patches  # a class token, where the model has one, comes first
        return {"source_tokens": labels, "attention": attention_maps(records, lambda r: (labels, labels)),
                **self._probabilities(logits[0])}

    def _visual_qa(self, text: str, image: str, question: str) -> dict[str, Any]:
        """The answers to ``question`` about the image, as `ask` gives them; the maps over the joint
        sequence, and each layer's text-to-image block (H, T, N), rows the [CLS] and the words."""
        if not question.strip():
            raise Refused('the question is empty; ask something about the image, e.g. "how many circles?"')
        tokenizer, longest = self.tokenizers["src"], self.data_cfg.max_question_len
        self._encode(question, "src", longest)  # refused: nothing known, or more tokens than the model reads
        images, picture = request_image(self.task, self.run_dir, text, image, self.allow_files)
        ids = torch.tensor(question_ids(tokenizer, [question], longest, "the question"), device=self.device)  # (1, T)
        logits, records, modality = cross_modal_pass(self.model, images.to(self.device), ids)
        words = ["[CLS]", *tokenizer.id_tokens(ids[0, 1:].tolist())]  # <bos> is read as [CLS]
        patches = self.cfg.patch_labels[:int((modality == IMAGE).sum())]  # none: the text-only baseline
        labels = words + patches  # the joint sequence: the question, then the patches
        to_image = [{"module": r.module, "stack": r.stack, "layer": r.layer, "kind": "text-to-image", "rows": words,
                     "cols": patches, "probs": blocks(r.probs[0], modality)["text_to_image"].tolist()}
                    for r in sorted(records.values(), key=lambda r: r.layer)]  # (H, T, N) each
        return {"question_tokens": words, "source_tokens": labels, "grid": list(self.cfg.grid), "picture": picture,
                "attention": attention_maps(records, lambda r: (labels, labels)), "text_to_image": to_image,
                **self._probabilities(logits)}

    # -- shared steps -------------------------------------------------------------------------------
    def _probabilities(self, logits: Tensor) -> dict[str, Any]:
        """A classifier's (n_classes,) logits -> its classes as outputs, most probable first."""
        names = self.run_dir.read_task_state()["labels"]
        p = logits.float().softmax(-1).tolist()
        ranked = sorted(zip(names, p), key=lambda pair: -pair[1])
        return {"outputs": [{"label": label, "probability": prob} for label, prob in ranked], "chosen": 0}

    def _pass(self, src: Tensor | None, inputs: Tensor) -> tuple[dict[str, AttentionRecord], Tensor]:
        """One pass over ``inputs`` (1, T) (and ``src``): every module's weights, and the (T, V)
        log-probabilities of the token after each position."""
        with capture_attention(self.model) as captured:
            logits = self.model(src, inputs) if src is not None else self.model(inputs)  # (1, T, V)
        return captured.last(), logits[0].float().log_softmax(-1)


def picked(logprobs: Tensor, first: int, tokens: list[int]) -> list[float]:
    """log P of each of ``tokens``, predicted at positions ``first``, ``first`` + 1, ... of (T, V) ``logprobs``;
    for a search's output they add up to the score it gave."""
    positions = torch.arange(first, first + len(tokens), device=logprobs.device)
    return logprobs[positions, torch.tensor(tokens, dtype=torch.long, device=logprobs.device)].tolist()


def attention_maps(records: dict[str, AttentionRecord], axes) -> list[dict[str, Any]]:
    """Each module's weights of the one input, for the API: encoder self-attention, then decoder
    self-attention, then cross-attention, each by layer. ``axes(record)`` gives its (row labels,
    column labels); ``probs`` is (H, Tq, Tk) as nested lists, ``entropy`` each head's mean entropy
    over the queries (nats; ``uniform_entropy`` that of a uniform head over the keys)."""
    order = {("encoder", "self"): 0, ("decoder", "self"): 1, ("decoder", "cross"): 2}
    maps = []
    for record in sorted(records.values(), key=lambda r: (order.get((r.stack, r.kind), 3), r.layer)):
        rows, cols = axes(record)
        maps.append({"module": record.module, "stack": record.stack, "layer": record.layer, "kind": record.kind,
                     "rows": rows, "cols": cols, "probs": record.probs[0].tolist(),
                     "entropy": head_entropy(record.probs).tolist(),
                     "uniform_entropy": math.log(record.probs.shape[-1])})
    return maps
