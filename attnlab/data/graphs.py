"""Graphs for node classification: a node table and an edge list read from CSV files, and the
built-in Zachary's karate club (from networkx).

Every reader raises a :class:`DataError` naming the file and line of the first problem (and the
column, for a feature that is not a number). Edges are undirected; a self-loop adds nothing (a
node always attends to itself) and is dropped, as are repeated edges.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnlab.data.corpora import read_lines
from attnlab.errors import DataError

BUILTIN_GRAPHS = ("karate",)


@dataclass(frozen=True)
class Graph:
    """N nodes, each with an id, F features and a label (None: unlabelled), and undirected edges
    between node indices (i < j, each once)."""

    name: str  # where it came from, for messages
    ids: list[str]
    features: list[list[float]]  # (N, F)
    labels: list[str | None]
    edges: list[tuple[int, int]]

    def adjacency(self) -> Tensor:
        """(N, N) boolean, symmetric, no self-loops."""
        a = torch.zeros(len(self.ids), len(self.ids), dtype=torch.bool)
        if self.edges:
            i, j = torch.tensor(self.edges).T
            a[i, j] = a[j, i] = True
        return a


def _csv_rows(path: str | Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header's column names and each later row, with its line number; every row as wide as
    the header."""
    lines = read_lines(path)
    header, *rows = csv.reader(lines)
    header = [name.strip() for name in header]
    numbered = []
    for n, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DataError(
                f"{path}:{n}: {len(row)} comma-separated fields; the header has {len(header)} ({', '.join(header)})"
            )
        numbered.append((n, row))
    if not numbered:
        raise DataError(f"{path}: no rows after the header line")
    return header, numbered


def _column(path: str | Path, header: list[str], name: str) -> int:
    if name not in header:
        raise DataError(f"{path}:1: no '{name}' column (the header names {', '.join(header)})")
    return header.index(name)


def _number(path: str | Path, n: int, column: int, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise DataError(f"{path}:{n}:{column + 1}: feature '{name}' is not a finite number ({text!r})")
    return value


def read_nodes(path: str | Path) -> tuple[list[str], list[list[float]], list[str | None]]:
    """A CSV whose header names an ``id`` column, a ``label`` column and the features (every other
    column, in order): the ids, the (N, F) features and the labels (None where the label is empty)."""
    header, rows = _csv_rows(path)
    id_col, label_col = _column(path, header, "id"), _column(path, header, "label")
    feature_cols = [c for c in range(len(header)) if c not in (id_col, label_col)]
    if not feature_cols:
        raise DataError(f"{path}:1: no feature columns (the header names only {', '.join(header)})")
    ids, features, labels = [], [], []
    seen: dict[str, int] = {}  # node id -> the line that gave it
    for n, row in rows:
        node = row[id_col].strip()
        if not node:
            raise DataError(f"{path}:{n}: empty id")
        if node in seen:
            raise DataError(f"{path}:{n}: node '{node}' is already on line {seen[node]}")
        seen[node] = n
        ids.append(node)
        features.append([_number(path, n, c, header[c], row[c].strip()) for c in feature_cols])
        labels.append(row[label_col].strip() or None)
    return ids, features, labels


def read_edges(path: str | Path, ids: list[str], nodes_path: str | Path) -> list[tuple[int, int]]:
    """A CSV whose header names ``source`` and ``target`` columns (others are ignored): the
    undirected edges between the nodes ``ids`` (read from ``nodes_path``), as index pairs i < j."""
    header, rows = _csv_rows(path)
    ends = _column(path, header, "source"), _column(path, header, "target")
    index = {node: i for i, node in enumerate(ids)}
    edges = set()
    for n, row in rows:
        pair = []
        for column, end in zip(ends, ("source", "target")):
            node = row[column].strip()
            if node not in index:
                raise DataError(f"{path}:{n}: {end} '{node}' is not a node of {nodes_path}")
            pair.append(index[node])
        i, j = sorted(pair)
        if i != j:
            edges.add((i, j))
    return sorted(edges)


def read_graph(nodes_path: str | Path, edges_path: str | Path) -> Graph:
    ids, features, labels = read_nodes(nodes_path)
    return Graph(str(nodes_path), ids, features, labels, read_edges(edges_path, ids, nodes_path))


def read_answers(path: str | Path, ids: list[str], graph_name: str) -> list[tuple[int, str, int]]:
    """A CSV with ``id`` and ``label`` columns (others are ignored): the true labels of nodes of a
    graph whose nodes are ``ids``, as (node index, label, line)."""
    header, rows = _csv_rows(path)
    id_col, label_col = _column(path, header, "id"), _column(path, header, "label")
    index = {node: i for i, node in enumerate(ids)}
    answers = []
    for n, row in rows:
        node, label = row[id_col].strip(), row[label_col].strip()
        if node not in index:
            raise DataError(f"{path}:{n}: node '{node}' is not a node of {graph_name}")
        if not label:
            raise DataError(f"{path}:{n}: empty label")
        answers.append((index[node], label, n))
    return answers


def karate_club() -> Graph:
    """Zachary's karate club (networkx.karate_club_graph): 34 members, 78 friendships, each member
    labelled with the club they joined after the split ('Mr. Hi' or 'Officer'); the features are
    one-hot identities (member i: the i-th unit vector), so all that tells members apart beyond
    themselves is the graph."""
    import networkx

    g = networkx.karate_club_graph()
    n = g.number_of_nodes()
    return Graph(
        "karate",
        [str(i) for i in range(n)],
        torch.eye(n).tolist(),
        [g.nodes[i]["club"] for i in range(n)],
        sorted((min(i, j), max(i, j)) for i, j in g.edges()),
    )
