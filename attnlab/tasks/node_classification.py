"""Node classification: one graph, some of its nodes labelled, the rest to be classified. The task
is transductive: the whole graph is one batch (every node is encoded, labelled or not), and the
loss and the metrics count only the nodes of the split at hand. A classifier task (classifier_task.py's
ClassifierTask: the cross-entropy, accuracy and macro-F1, `attnlab evaluate --split`); `attnlab
evaluate --data FILE` scores a run on a CSV of node ids and their true labels."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Optional, cast

import torch
from torch import Tensor, nn

from attnlab.config import one_of
from attnlab.data.graphs import BUILTIN_GRAPHS, Graph, karate_club, read_answers, read_graph
from attnlab.errors import ConfigError, DataError
from attnlab.models.family import Inputs
from attnlab.models.shape import DataShape
from attnlab.nn.graph import laplacian_eigenvectors
from attnlab.tasks.batching import Batching, Tokenizers
from attnlab.tasks.classifier_task import NO_LABEL, ClassifierTask, ExampleBatch, evaluation_report
from attnlab.tasks.parts import Splits
from attnlab.tasks.task import TaskConfig, register_task

UNLABELLED = NO_LABEL  # the class id of an unlabelled node; no split holds one
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class NodeClassificationConfig(TaskConfig):
    """The graph: ``builtin: karate`` (data/graphs.py: karate_club), or ``nodes`` (CSV: id, feature
    columns..., label; an empty label for an unlabelled node) and ``edges`` (CSV: source, target;
    undirected). The labelled nodes are split per class as ``splits`` says (tasks/parts.py), with
    ``random.Random(splits.seed)``: of each class's nodes, shuffled, the first round(n x
    splits.test_fraction) are test nodes, the next round(n x splits.valid_fraction) validation nodes
    and the rest training nodes (halves round up)."""

    builtin: Optional[str] = None
    nodes: Optional[str] = None
    edges: Optional[str] = None
    splits: Splits = Splits(seed=0, valid_fraction=0.2, test_fraction=0.2)
    splits_read = ("seed", "valid_fraction", "test_fraction")

    def check(self) -> None:
        files = (self.nodes, self.edges)
        if self.builtin is not None:
            one_of("builtin", self.builtin, BUILTIN_GRAPHS)
            if files != (None, None):
                raise ConfigError("give either builtin or nodes and edges, not both")
        elif None in files:
            raise ConfigError(
                "data.task 'node_classification' needs 'nodes' and 'edges' (CSV files), or builtin "
                f"({', '.join(map(repr, BUILTIN_GRAPHS))})"
            )
        self.splits.read_by(self.chosen_name(), self.splits_read)
        self.splits.given(*self.splits_read)

    @property
    def in_memory(self) -> bool:
        return self.builtin is not None

    def read(self) -> Graph:
        # check: without builtin, nodes and edges are given
        return karate_club() if self.builtin == "karate" else read_graph(cast(str, self.nodes), cast(str, self.edges))


def split_nodes(
    classes: list[int], n_classes: int, valid_fraction: float, test_fraction: float, seed: int
) -> dict[str, list[int]]:
    """The node indices of each split, per class as NodeClassificationConfig says, each sorted;
    unlabelled nodes (UNLABELLED) are in none."""
    rng = random.Random(seed)
    splits: dict[str, list[int]] = {name: [] for name in SPLITS}
    for c in range(n_classes):
        nodes = [i for i, label in enumerate(classes) if label == c]
        rng.shuffle(nodes)
        n_test, n_valid = int(len(nodes) * test_fraction + 0.5), int(len(nodes) * valid_fraction + 0.5)
        splits["test"] += nodes[:n_test]
        splits["valid"] += nodes[n_test : n_test + n_valid]
        splits["train"] += nodes[n_test + n_valid :]
    return {name: sorted(nodes) for name, nodes in splits.items()}


@dataclass
class GraphBatch(ExampleBatch):
    """The whole graph and the nodes that count: features (N, F), adjacency (N, N) boolean,
    eigenvectors (N, N - 1) of its Laplacian, classes (N,) (UNLABELLED where there is no label),
    nodes (M,) the indices whose loss and metrics count."""

    features: Tensor
    adjacency: Tensor
    eigenvectors: Tensor
    classes: Tensor
    nodes: Tensor

    @property
    def labels(self) -> Tensor:
        """(M,) the true classes of the split's nodes."""
        return self.classes[self.nodes]

    def logits(self, model: nn.Module) -> Tensor:
        """(M, n_classes): the model run on the whole graph, read at the split's nodes."""
        return model(self.features, self.adjacency, self.eigenvectors)[self.nodes]


@dataclass
class NodeData:
    """One graph, its labels (class id -> label), and the node indices of each split."""

    graph: Graph
    labels: list[str]
    splits: dict[str, list[int]]
    _batches: dict[str, GraphBatch] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        index = {label: c for c, label in enumerate(self.labels)}
        self.classes = torch.tensor([UNLABELLED if label is None else index[label] for label in self.graph.labels])
        self.features = torch.tensor(self.graph.features)  # (N, F)
        self.adjacency = self.graph.adjacency()  # (N, N)
        self.eigenvectors = laplacian_eigenvectors(self.adjacency)  # (N, N - 1), once per graph

    def batch(self, nodes: list[int], classes: Tensor | None = None) -> GraphBatch:
        """The graph with ``nodes`` counting; ``classes``: (N,) other true classes than the graph's own."""
        return GraphBatch(
            self.features,
            self.adjacency,
            self.eigenvectors,
            self.classes if classes is None else classes,
            torch.tensor(nodes, dtype=torch.long),
        )

    def epoch_batches(self, epoch: int) -> list[GraphBatch]:
        return self.eval_batches("train")

    def eval_batches(self, split: str) -> list[GraphBatch]:
        if split not in self._batches:
            self._batches[split] = self.batch(self.splits[split])
        return [self._batches[split]]


def known_labels(graph: Graph, labels: list[str]) -> None:
    """Refuse a node labelled with a class the run was not trained on (its graph's file changed)."""
    for node, label in zip(graph.ids, graph.labels):
        if label is not None and label not in labels:
            raise DataError(
                f"{graph.name}: node '{node}' has label '{label}', not one the model was trained on "
                f"({', '.join(labels)})"
            )


@register_task
class NodeClassification(ClassifierTask[NodeData, GraphBatch]):
    """A label for each node of a graph (data.task: node_classification); the loss and metrics
    count only the nodes of the split at hand."""

    name = "node_classification"
    config = NodeClassificationConfig
    needs = {"inputs": Inputs.GRAPH}
    commands = ("evaluate",)
    cfg: NodeClassificationConfig

    def prepare(
        self, batching: Batching | None, tokenizers: Tokenizers | None = None, state: dict[str, Any] | None = None
    ) -> NodeData:
        """The graph and its split (``batching`` is not used: the graph is one batch)."""
        graph = self.cfg.read()
        labels = state["labels"] if state else sorted({label for label in graph.labels if label is not None})
        if len(labels) < 2:
            raise DataError(f"{graph.name}: {len(labels)} distinct labels; node classification needs at least two")
        known_labels(graph, labels)
        index = {label: c for c, label in enumerate(labels)}
        classes = [UNLABELLED if label is None else index[label] for label in graph.labels]
        cfg = self.cfg
        held = cfg.splits
        splits = split_nodes(
            classes, len(labels), held.valid_fraction or 0.0, held.test_fraction or 0.0, held.seed or 0
        )
        empty = [name for name in SPLITS if not splits[name]]
        if empty:
            raise DataError(
                f"{graph.name}: {sum(c != UNLABELLED for c in classes)} labelled nodes leave no "
                f"{' or '.join(empty)} nodes at splits.valid_fraction {held.valid_fraction} and "
                f"splits.test_fraction {held.test_fraction}"
            )
        return NodeData(graph, labels, splits)

    def saved_state(self, data: NodeData) -> dict[str, Any]:
        return {"labels": data.labels}

    def data_shape(self, data: NodeData | None = None) -> DataShape:
        """Without ``data``: the graph's sizes where it is built in, else one feature, two classes."""
        if data is None and self.cfg.in_memory:
            data = self.prepare(None)
        if data is None:
            return DataShape(n_features=1, n_classes=2)
        return DataShape(n_features=len(data.graph.features[0]), n_classes=len(data.labels))

    def evaluate_file(
        self, model: nn.Module, tokenizers: Tokenizers, state: dict[str, Any], path: str, split: str | None
    ) -> dict[str, Any]:
        """Loss, accuracy, macro-F1 and the confusion matrix on the nodes of ``path`` (a CSV with
        ``id`` and ``label`` columns, others ignored: the true labels of nodes of the run's graph),
        the run's whole graph encoded as in training."""
        self.refuse_split(split)
        data = self.prepare(None, state=state)
        answers = read_answers(path, data.graph.ids, data.graph.name)
        classes = data.classes.clone()
        for node, label, n in answers:
            if label not in data.labels:
                raise DataError(
                    f"{path}:{n}: label '{label}' is not one the model was trained on ({', '.join(data.labels)})"
                )
            classes[node] = data.labels.index(label)
        return evaluation_report(model, [data.batch([node for node, _, _ in answers], classes)], data.labels)

    def describe(self, data: NodeData) -> str:
        g = data.graph
        sizes = ", ".join(f"{name} {len(nodes)}" for name, nodes in data.splits.items())
        return (
            f"graph {g.name}: {len(g.ids)} nodes, {len(g.edges)} edges, {len(g.features[0])} features; "
            f"labelled nodes: {sizes}; labels {', '.join(data.labels)}"
        )
