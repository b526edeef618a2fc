"""How a task's examples become training and evaluation batches: under a token budget, each example
once an epoch (fairseq's --max-tokens), or drawn with replacement; either way a function of (seed,
epoch, batch index) alone, so a resumed run draws exactly what an uninterrupted one would. The
batch and data protocols every task speaks are here too."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Mapping, Protocol, Sequence, TypeVar

import torch

from attnlab.data.batching import padded_to_multiple, sampled_batch, token_budget_batches
from attnlab.data.tokenizers import Tokenizer
from attnlab.errors import DataError

Tokenizers = dict[str, Tokenizer | None]


class Batch(Protocol):
    """What training needs of a task's batch: ``n_targets``, the number of targets its loss sums
    over (tokens, examples, ...), and a copy on a device."""

    @property
    def n_targets(self) -> int: ...

    def to(self, device: torch.device | str) -> "Batch": ...


class TaskData(Protocol):
    """A task's prepared data: the tokenizers by role (saved with the run; a task without tokens has
    no roles, and its data need not have the attribute), the splits, and the batches of any training
    epoch (the same for the same epoch, so a resumed run goes on exactly) and of an evaluation split."""

    tokenizers: Tokenizers
    splits: Mapping[str, Any]

    def epoch_batches(self, epoch: int) -> Sequence[Batch]: ...

    def eval_batches(self, split: str) -> Sequence[Batch]: ...


def batch_seed(seed: int, epoch: int, k: int) -> int:
    """The seed of batch ``k`` of ``epoch``'s random draws (windows, masks): from these alone, so
    that a resumed run draws exactly what an uninterrupted one would."""
    return (seed * 1_000_003 + epoch) * 1_000_033 + k


SAMPLINGS = ("epochs", "with_replacement")  # how training draws its examples (train.sampling)


E = TypeVar("E")  # one example of a task's data
BatchT = TypeVar("BatchT", bound=Batch)  # one of its batches


class SeededBatches(Sequence[BatchT]):
    """A virtual epoch of ``n`` batches, batch k of epoch e made by ``make`` from the seed of (seed, e, k)
    alone, so the sampler's whole state is the (epoch, batch) position that every checkpoint keeps,
    and a resumed run draws exactly what an uninterrupted one would."""

    def __init__(self, n: int, seed: int, epoch: int, make: Callable[[int], BatchT]) -> None:
        self.n, self.seed, self.epoch, self.make = n, seed, epoch, make

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> BatchT:  # type: ignore[override]
        if not 0 <= k < self.n:
            raise IndexError(k)
        return self.make(batch_seed(self.seed, self.epoch, k))


class SampledBatches(SeededBatches[BatchT]):
    """A virtual epoch of ceil(N / batch_size) batches of ``batch_size`` training examples drawn
    with replacement (:class:`SeededBatches`). ``make`` turns a list of examples and a seed into a batch."""

    def __init__(
        self, examples: list[E], batch_size: int, seed: int, epoch: int, make: Callable[[list[E], int], BatchT]
    ) -> None:
        def drawn(k_seed: int) -> BatchT:
            return make([examples[i] for i in sampled_batch(len(examples), batch_size, k_seed)], k_seed)

        super().__init__(-(-len(examples) // batch_size), seed, epoch, drawn)


@dataclass(kw_only=True)
class BucketedData(Generic[E, BatchT]):
    """Examples of varied lengths, batched under a token budget (batching.token_budget_batches,
    fairseq's --max-tokens), each training example once an epoch; or, with ``sampling``
    'with_replacement', training batches of ``batch_size`` examples drawn with replacement
    (:class:`SampledBatches`). Either way the batches of an epoch depend only on (seed, epoch), so a
    resumed run continues exactly; a split's evaluation batches are made once, by the token budget.
    A task's data says how long an example is and how a group of them becomes a batch."""

    tokenizers: Tokenizers
    splits: dict[str, list[E]]
    seed: int = 0
    max_tokens: int = 4096
    pad_multiple: int = 1  # every (B, T) tensor of a batch padded to T a multiple of this
    sampling: str = "epochs"
    batch_size: int = 32  # examples a batch, where sampling is 'with_replacement'
    _eval: dict[str, list[BatchT]] = field(default_factory=dict, repr=False)

    def length(self, example: E) -> int:
        """Its padded length in the batch: what the token budget counts."""
        raise NotImplementedError

    def collate(self, examples: list[E], seed: int) -> BatchT:
        """One batch; ``seed`` (:func:`batch_seed`) for any random draw it makes."""
        raise NotImplementedError

    def epoch_batches(self, epoch: int) -> Sequence[BatchT]:
        if self.sampling == "with_replacement":
            return SampledBatches(self.splits["train"], self.batch_size, self.seed, epoch, self._padded)
        return self._batches(self.splits["train"], self.seed, epoch)

    def eval_batches(self, split: str) -> list[BatchT]:
        if split not in self._eval:
            self._eval[split] = self._batches(self.splits[split], seed=0, epoch=0)
        return self._eval[split]

    def _batches(self, examples: list[E], seed: int, epoch: int) -> list[BatchT]:
        groups = token_budget_batches([self.length(e) for e in examples], self.max_tokens, seed, epoch)
        return [
            self._padded([examples[i] for i in group], batch_seed(seed, epoch, k)) for k, group in enumerate(groups)
        ]

    def _padded(self, examples: list[E], seed: int) -> BatchT:
        return padded_to_multiple(self.collate(examples, seed), self.pad_multiple)


def hold_out_valid(
    splits: dict[str, list[Any]], n_valid: int, train_path: str | None, what: str, field: str = "n_valid"
) -> dict[str, list[Any]]:
    """The splits with a 'valid' one: as given, or else the last ``n_valid`` training examples
    (``what`` names them, and ``field`` the config's field of ``n_valid``, in the error when there
    are too few)."""
    if "valid" in splits:
        return splits
    train = splits["train"]
    if len(train) <= n_valid:
        raise DataError(
            f"{train_path}: {len(train)} {what} are too few to hold out {field} ({n_valid}) for "
            f"validation; give a 'valid' file"
        )
    return splits | {"train": train[:-n_valid], "valid": train[-n_valid:]}


@dataclass(frozen=True)
class Batching:
    """How training wants its batches: a token budget (pairs), a number of rows (windows,
    examples), the seed of their order, and how training draws its examples (``sampling``)."""

    max_tokens: int
    batch_size: int
    seed: int
    pad_multiple: int = 1
    sampling: str = "epochs"  # one of SAMPLINGS

    def bucketing(self) -> dict[str, Any]:
        """The fields of :class:`BucketedData` that batching sets."""
        return {
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "pad_multiple": self.pad_multiple,
            "sampling": self.sampling,
            "batch_size": self.batch_size,
        }
