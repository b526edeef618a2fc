"""The graph family (Dwivedi & Bresson's Graph Transformer) and the node-classification task:
neighbourhood attention against softmax over neighbours by hand, Laplacian eigenvectors against
their closed forms, the readers and the split, and Zachary's karate club trained end to end."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import ConfigError, build_model, model_config
from attnlab.nn.graph import LaplacianPositionalEncoding, laplacian_eigenvectors, neighbourhoods, normalized_laplacian
from attnlab.nn.masks import AttentionMask


def adjacency(n: int, edges: list[tuple[int, int]]) -> torch.Tensor:
    """(n, n) symmetric boolean adjacency of an undirected edge list."""
    a = torch.zeros(n, n, dtype=torch.bool)
    for i, j in edges:
        a[i, j] = a[j, i] = True
    return a


# a triangle 0-1-2 with a tail 2-3, and node 4 isolated
SMALL = adjacency(5, [(0, 1), (1, 2), (0, 2), (2, 3)])


def by_hand(attn, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Multi-head self-attention of (N, D) node vectors where node i takes the softmax over its
    neighbours and itself only, one node and one head at a time from the adjacency lists."""
    n, d = x.shape
    h, dh = attn.n_heads, d // attn.n_heads
    q, k, v = attn.qkv_proj(x).split(d, dim=-1)  # (N, D) each
    heads = []
    for head in range(h):
        cols = slice(head * dh, (head + 1) * dh)
        rows = []
        for i in range(n):
            seen = [j for j in range(n) if j == i or a[i, j]]
            scores = torch.stack([q[i, cols] @ k[j, cols] / math.sqrt(dh) for j in seen])
            weights = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
            rows.append(sum(w * v[j, cols] for w, j in zip(weights, seen)))
        heads.append(torch.stack(rows))  # (N, Dh)
    return attn.out_proj(torch.cat(heads, dim=-1))  # (N, D)


@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_neighbourhood_attention_is_the_softmax_over_neighbours_and_self(backend):
    torch.manual_seed(0)
    model = build_model(model_config(arch="graph", n_features=3, d_model=8, n_heads=2, n_layers=1,
                                     attention_backend=backend)).eval()
    attn = model.encoder.layers[0].self_attn
    x = torch.randn(5, 8)
    with torch.no_grad():
        out, _ = attn(x[None], mask=AttentionMask(explicit=neighbourhoods(SMALL)))
        assert torch.allclose(out[0], by_hand(attn, x, SMALL), atol=1e-5)


def test_non_edges_get_zero_weight_and_an_isolated_node_attends_to_itself_alone():
    torch.manual_seed(0)
    model = build_model(model_config(arch="graph", n_features=3, d_model=8, n_heads=2, n_layers=1,
                                     attention_backend="math")).eval()
    attn = model.encoder.layers[0].self_attn
    with torch.no_grad():
        _, weights = attn(torch.randn(1, 5, 8), mask=AttentionMask(explicit=neighbourhoods(SMALL)), need_weights=True)
    allowed = SMALL | torch.eye(5, dtype=torch.bool)
    assert torch.all(weights[0][:, ~allowed] == 0)  # (H, N, N): nothing off the neighbourhoods
    assert torch.allclose(weights[0].sum(-1), torch.ones(2, 5))
    assert torch.equal(weights[0, :, 4], torch.eye(5)[4].expand(2, 5))  # node 4: weight 1 on itself


def test_a_node_sees_only_its_neighbourhood_per_layer():
    """One layer: the logits of nodes 0 and 1 depend on nodes 0, 1, 2 only; changing node 3 (two
    hops away) and the isolated node 4 leaves them unchanged. Two layers reach node 3."""
    torch.manual_seed(0)
    features = torch.randn(5, 3)
    changed = features.clone()
    changed[3:] += 1.0
    eigenvectors = laplacian_eigenvectors(SMALL)
    for n_layers, reached in ((1, False), (2, True)):
        model = build_model(model_config(arch="graph", n_features=3, d_model=8, n_heads=2, n_layers=n_layers,
                                         laplacian_k=0)).eval()
        with torch.no_grad():
            before, after = model(features, SMALL, eigenvectors), model(changed, SMALL, eigenvectors)
        assert torch.equal(before[:2], after[:2]) != reached
        assert not torch.allclose(before[3:], after[3:])


def test_the_normalised_laplacian_of_a_path_by_hand():
    r = 1 / math.sqrt(2)  # 1 / sqrt(d_0 d_1) with degrees 1 and 2
    expected = torch.tensor([[1, -r, 0], [-r, 1, -r], [0, -r, 1]], dtype=torch.float64)
    assert torch.allclose(normalized_laplacian(adjacency(3, [(0, 1), (1, 2)])), expected)


def test_path_eigenvectors_match_the_closed_form_up_to_sign():
    """P_n: L's eigenvalues are 1 - cos(pi j / (n - 1)) and its eigenvectors sqrt(d_x) cos(pi j x / (n - 1))
    (D^1/2 times the random walk's eigenvectors), normalised; j = 0 is the trivial one."""
    n = 6
    got = laplacian_eigenvectors(adjacency(n, [(i, i + 1) for i in range(n - 1)])).double()
    degree = torch.tensor([1.0] + [2.0] * (n - 2) + [1.0], dtype=torch.float64)
    x = torch.arange(n, dtype=torch.float64)
    assert got.shape == (n, n - 1)
    for j in range(1, n):
        closed = degree.sqrt() * torch.cos(math.pi * j * x / (n - 1))
        closed = closed / closed.norm()
        sign = torch.sign(got[:, j - 1] @ closed)
        assert torch.allclose(sign * got[:, j - 1], closed, atol=1e-6)


def test_cycle_eigenvectors_have_the_closed_form_eigenvalues():
    """C_n (2-regular): eigenvalues 1 - cos(2 pi j / n), in pairs, so the vectors are checked as
    eigenvectors (a pair's basis is arbitrary), orthonormal, and orthogonal to the constant one."""
    n = 6
    a = adjacency(n, [(i, (i + 1) % n) for i in range(n)])
    got = laplacian_eigenvectors(a).double()
    eigenvalues = sorted(1 - math.cos(2 * math.pi * j / n) for j in range(n))[1:]  # 0.5, 0.5, 1.5, 1.5, 2
    laplacian = normalized_laplacian(a)
    for column, value in zip(got.T, eigenvalues):
        assert torch.allclose(laplacian @ column, value * column, atol=1e-6)
    assert torch.allclose(got.T @ got, torch.eye(n - 1, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(got.sum(0), torch.zeros(n - 1, dtype=torch.float64), atol=1e-6)


def test_an_isolated_node_has_an_eigenvector_of_its_own():
    """SMALL's eigenvalues: 0, 0.771, 1.5 and 1.729 on the component 0-3, and 1 on node 4 (D^-1/2 taken
    as 0 there): the eigenvector of 1, the second non-trivial one, is on node 4 alone."""
    got = laplacian_eigenvectors(SMALL)
    assert torch.allclose(got[:, 1].abs(), torch.eye(5)[4])
    assert torch.equal(got[4, [0, 2, 3]], torch.zeros(3))


def identity_encoding(k: int) -> LaplacianPositionalEncoding:
    """A positional encoding whose linear map is the identity, to see lambda_i itself."""
    pe = LaplacianPositionalEncoding(k, k)
    with torch.no_grad():
        pe.proj.weight.copy_(torch.eye(k))
        pe.proj.bias.zero_()
    return pe


def test_k_beyond_the_graph_pads_with_zero_columns():
    """A 3-node path has 2 non-trivial eigenvectors; k = 5 takes them and 3 zero columns."""
    eigenvectors = laplacian_eigenvectors(adjacency(3, [(0, 1), (1, 2)]))
    with torch.no_grad():
        lam = identity_encoding(5).eval()(eigenvectors)
    assert torch.equal(lam[:, :2], eigenvectors) and torch.equal(lam[:, 2:], torch.zeros(3, 3))


def test_training_flips_each_eigenvectors_sign_at_random():
    eigenvectors = laplacian_eigenvectors(SMALL)
    pe = identity_encoding(4).train()
    torch.manual_seed(0)
    with torch.no_grad():
        draws = [pe(eigenvectors) for _ in range(20)]
    signs = torch.stack([torch.sign((d * eigenvectors).sum(0)) for d in draws])  # (20, k): +1 kept, -1 flipped
    assert all(torch.equal(d.abs(), eigenvectors.abs()) for d in draws)
    assert set(signs.flatten().tolist()) == {1.0, -1.0} and signs.shape == (20, 4)
    assert torch.equal(pe.eval()(eigenvectors), eigenvectors)  # evaluation: as computed


@pytest.mark.parametrize("fields,message", [
    (dict(attention_backend="chunked"), r"attention_backend 'chunked' takes no explicit mask, which arch 'graph' attends "
                                        r"through \(each node's neighbourhood\); use 'math' or 'sdpa' or 'auto'"),
    (dict(attention_backend="linear"), "attention_backend 'linear' takes no explicit mask"),
    (dict(attention_backend="local"), "attention_backend 'local' takes no explicit mask"),
    (dict(d_model=30, n_heads=4), r"d_model \(30\) must be divisible by n_heads \(4\)"),
    (dict(laplacian_k=-1), r"laplacian_k must be >= 0 \(got -1\)"),
    (dict(n_classes=1), r"n_classes must be >= 2 \(got 1\)"),
    (dict(norm="sandwich"), "norm must be one of"),
    (dict(positional="rotary"), "model.arch 'graph' has no field 'positional'"),
])
def test_the_config_refuses_early_naming_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        model_config(arch="graph", n_features=4, **fields)
