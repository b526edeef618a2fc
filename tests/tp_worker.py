"""Run under torchrun by tests/test_parallel.py: the gradients and one clipped plain-SGD update of a
tiny model of each Transformer family named, split across the ranks by tensor parallelism
(parallel/tensor_parallel.py), and the same computed whole in rank 0 alone; rank 0 saves both, and
whether every rank's rows of each fused projection were its own heads' [Q_r; K_r; V_r]."""

from __future__ import annotations

import sys

import torch
from torch import nn

from attnlab import build_model
from attnlab.config import overlaid
from attnlab.data.batching import collate_pairs
from attnlab.data.tokenizers import PAD
from attnlab.eval.likelihood import teacher_forced_loss
from attnlab.parallel.distributed import World, exit_worker, joined_world, whole
from attnlab.parallel.tensor_parallel import tensor_parallel
from attnlab.runs.train_config import TrainConfig
from attnlab.tasks.masked_lm import MaskedLMConfig, MLMBatch
from attnlab.train.schedules import make_schedule, make_scheduler
from attnlab.train.step import accumulate_gradients, train_step

from helpers import sized

CFG = TrainConfig(lr_schedule="constant", lr=0.1, warmup_steps=1, label_smoothing=0.1, clip_norm=0.5)
SIZES = dict(vocab_size=30, stack=dict(d_model=16, n_heads=4, n_layers=2, d_ff=32, dropout=0.0))
FAMILIES = {
    "encoder_decoder": {},
    "decoder_lm": {"positions": {"scheme": "rotary"}, "stack": {"norm": "pre"}},
    "encoder_only": {
        "embeddings": {"kind": "normed"},
        "positions": {"scheme": "learned", "max_len": 32},
    },
}


def batches(arch: str) -> tuple[list, object]:
    """Two batches of this family's task, of different lengths, and its loss."""
    g = torch.Generator().manual_seed(1)
    out = []
    for b in range(2):
        pairs = [
            (
                torch.randint(4, 30, (3 + b + i,), generator=g).tolist(),
                torch.randint(4, 30, (2 + 2 * b + i,), generator=g).tolist(),
            )
            for i in range(3)
        ]
        out.append(collate_pairs(pairs))
    if arch == "decoder_lm":
        return [type(x)(None, x.tgt_in, x.tgt_out) for x in out], teacher_forced_loss
    if arch == "encoder_only":
        return [MLMBatch(x.src, torch.where(x.src % 3 == 0, x.src, PAD)) for x in out], MaskedLMConfig().task.loss
    return out, teacher_forced_loss


def model(arch: str) -> nn.Module:
    torch.manual_seed(0)
    return build_model(*sized(arch=arch, **overlaid(SIZES, FAMILIES[arch])))


def own_blocks(net: nn.Module, whole_weights: dict[str, torch.Tensor], rank: int, size: int) -> bool:
    """Whether this rank's rows of every fused projection (a linear its plan splits block by block)
    are block r of each stacked matrix."""
    fused = {path: how.blocks for path, how in net.tensor_plan().linears.items() if how.blocks > 1}
    for name, p in net.named_parameters():
        if (module := name.rpartition(".")[0]) in fused:
            blocks = whole_weights[name].chunk(fused[module])  # W^Q, W^K, W^V (or W^K, W^V)
            if not torch.equal(p.to_local(), torch.cat([b.chunk(size)[rank] for b in blocks])):
                return False
    return True


def update(net: nn.Module, arch: str, world: World | None = None) -> dict[str, dict[str, torch.Tensor]]:
    """Gradients of the loss over the batches, then a train_step (clipped, plain SGD) on them; whole.
    With ``world`` (data parallel ranks), each rank's share of the batches."""
    data, loss = batches(arch)
    data = data[world.rank :: world.size] if world else data
    sums = accumulate_gradients(net, data, CFG, world=world, objective=loss)
    grads = {n: whole(p.grad).clone() for n, p in net.named_parameters() if p.grad is not None}
    optimizer = torch.optim.SGD(net.parameters(), lr=CFG.lr)
    optimizer.zero_grad(set_to_none=True)
    scheduler = make_scheduler(optimizer, make_schedule("constant", CFG.lr, 1, 10, 0.0, 1))
    out = train_step(net, data, optimizer, scheduler, CFG, world=world, objective=loss)
    return {
        "loss": sums["loss_sum"],
        "grad_norm": out["grad_norm"],
        "grads": grads,
        "weights": {n: whole(p.detach()).clone() for n, p in net.named_parameters() if n in grads},
    }


if __name__ == "__main__":
    out, families = sys.argv[1], sys.argv[2:]
    results = {}
    with joined_world() as world:
        for arch in families:
            split = tensor_parallel(model(arch), world.size, "cpu")
            blocks_ok = own_blocks(split, model(arch).state_dict(), world.rank, world.size)
            results[arch] = {"tp": update(split, arch), "blocks_ok": world.all_sum(blocks_ok)[0] == world.size}
            if world.is_main:
                results[arch]["one"] = update(model(arch), arch)
    if world.is_main:
        torch.save(results, out)
    exit_worker(0)
