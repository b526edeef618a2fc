"""What the code around a model asks of it, as ``typing.Protocol``s: decoding asks a seq2seq model
to encode once and decode step by step, training under tp asks a model for its tensor-parallel
plan, and so on. A family's registration checks its model class against the protocols its declared
capabilities promise (models/family.py); elsewhere ``isinstance(model, Seq2SeqModel)`` replaces
asking for a method by name. Runtime checks see that the methods exist, not their signatures.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

from attnlab.nn.tensor_plan import TensorPlan


@runtime_checkable
class EncodingModel(Protocol):
    """A model whose input can be encoded alone: ``encode(inputs...)`` -> its (B, S, d_model)
    vectors (a seq2seq model's: with their (B, S) validity)."""

    def encode(self, *inputs: Tensor) -> Any: ...


@runtime_checkable
class Seq2SeqModel(Protocol):
    """A source encoded once, a target decoded over it: ``encode(src)`` -> memory (B, S, d_model)
    and its (B, S) validity; ``decode(tgt_in, memory, src_valid, cache)`` -> (B, T, V) logits."""

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]: ...

    def decode(self, tgt_in: Tensor, memory: Tensor, src_valid: Tensor, cache: Any = None) -> Tensor: ...


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model: (B, T) ids -> (B, T, V) logits of each next token."""

    def forward(self, ids: Tensor) -> Tensor: ...


@runtime_checkable
class SpectrogramTokens(Protocol):
    """A model of sound whose tokens tile its spectrogram (an AST's patches, a frames model's frame pairs):
    ``spectrogram_grid(image)``, the (rows, columns) of its tokens over a (B, 1, n_mels, F) image, row-major
    as they are read (analysis/inspect_audio.py draws their attention on the spectrogram)."""

    def spectrogram_grid(self, image: Tensor) -> tuple[int, int]: ...


@runtime_checkable
class CTCModel(Protocol):
    """A model read by CTC (decode/ctc.py): ``ctc_log_probs(src)`` -> (B, T, V) log-probabilities of
    each frame's symbol, over a vocabulary with a blank (id ``blank``), and the (B,) valid frames of each row."""

    blank: int

    def ctc_log_probs(self, src: Tensor) -> tuple[Tensor, Tensor]: ...


@runtime_checkable
class IncrementalDecoder(Protocol):
    """A model that decodes one step at a time over a cache: ``new_cache()`` (decode/session.py)."""

    def new_cache(self) -> Any: ...


@runtime_checkable
class Classifier(Protocol):
    """A model with a classification head: ``classify(inputs...)`` -> (B, n_classes) logits."""

    def classify(self, *inputs: Tensor) -> Tensor: ...


@runtime_checkable
class StagedModel(Protocol):
    """A model that cuts itself into pipeline stages (train.strategy pp, nn/stages.py)."""

    def stages(self, n: int, head: str = "forward") -> list[nn.Module]: ...


@runtime_checkable
class TensorParallelModel(Protocol):
    """A model that declares how tensor parallelism divides it (train.strategy tp, nn/tensor_plan.py)."""

    def tensor_plan(self) -> TensorPlan: ...
