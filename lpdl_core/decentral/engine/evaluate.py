"""Test-set evaluation of all nodes: each node's accuracy, their mean (the official reported
metric, docs/paper-vs-code.md, 'Evaluation and the reported number'), the accuracy of the
parameter-averaged model (the paper's wording) and the consensus distance."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import functional_call

from .simulator import Simulator


@dataclass(frozen=True)
class Evaluation:
    node_acc: tuple[float, ...]   # accuracy (%) of each node's de-biased model z_i
    mean_acc: float               # mean of node_acc (official metric)
    avg_model_acc: float          # accuracy (%) of z̄ = mean_i z_i
    consensus_distance: float     # sqrt(mean_i ||z_i - z̄||^2)
    mean_loss: float              # mean over nodes of the test cross-entropy

    def as_dict(self) -> dict:
        return {"node_acc": list(self.node_acc), "mean_acc": self.mean_acc,
                "avg_model_acc": self.avg_model_acc,
                "consensus_distance": self.consensus_distance, "mean_loss": self.mean_loss}


@torch.no_grad()
def evaluate(sim: Simulator, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
             transform=None) -> Evaluation:
    """Evaluate every node and the averaged model on (x, y), already on sim.device.

    transform: applied to each input chunk (e.g. uint8 -> normalized float), so a large test set
    is never materialized in float all at once.
    """
    shard = sim.shard(len(x))  # the averaged model is the same everywhere: each process takes a part
    correct, loss_sum, (avg_correct,) = _count(sim, x, y, batch_size, transform,
                                               [(sim.average, sim.average_buffers())], shard)
    acc = (100.0 * sim.gather_rows(correct) / len(x)).tolist()
    return Evaluation(node_acc=tuple(acc), mean_acc=sum(acc) / sim.n,
                      avg_model_acc=float(100.0 * sim.node_total(avg_correct) / len(x)),
                      consensus_distance=sim.consensus_distance(),
                      mean_loss=float(sim.gather_rows(loss_sum).mean() / len(x)))


@torch.no_grad()
def evaluate_cells(sim, cells: list[int], x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024,
                   transform=None) -> list[Evaluation]:
    """`evaluate` for the listed cells of a pack (engine/packed.py), each on its own rows: the
    same numbers as the cell's solo run (one pass over the test set for all of them)."""
    averages = [(sim.cell_average(k), sim.average_buffers(sim.rows_of[k])) for k in cells]
    correct, loss_sum, avg_correct = _count(sim, x, y, batch_size, transform, averages, slice(0, len(x)))
    out = []
    for k, avg in zip(cells, avg_correct):
        rows = sim.rows_of[k]
        acc = (100.0 * correct[rows] / len(x)).tolist()
        out.append(Evaluation(node_acc=tuple(acc), mean_acc=sum(acc) / len(acc),
                              avg_model_acc=float(100.0 * avg / len(x)),
                              consensus_distance=sim.consensus_distance(sim.rows_of[k]),
                              mean_loss=float(loss_sum[rows].mean() / len(x))))
    return out


def _count(sim, x, y, batch_size, transform, averages, shard):
    """Per row held: correct predictions and summed test loss over (x, y); per averaged model
    (flat parameters, buffers) in `averages`: correct predictions on the `shard` of the samples."""
    rows = sim.z.shape[0]  # the nodes this process holds: all n, or one in a NodeProcess
    correct = torch.zeros(rows, device=sim.device)
    loss_sum = torch.zeros(rows, device=sim.device)
    avg_correct = [torch.zeros((), device=sim.device) for _ in averages]
    module = sim.executor.reference_module()
    models = [(dict(zip(sim.layout.names, sim.layout.views(flat))), buffers) for flat, buffers in averages]
    was_training = module.training
    module.eval()
    for s in range(0, len(x), batch_size):
        xb, yb = x[s:s + batch_size], y[s:s + batch_size]
        if transform is not None:
            xb = transform(xb)
        logits = sim.executor.logits(xb)  # (rows, B, C)
        correct += (logits.argmax(-1) == yb).sum(1)
        loss_sum += torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), yb.repeat(rows), reduction="none").view(rows, -1).sum(1)
        lo, hi = max(shard.start - s, 0), min(shard.stop - s, len(xb))
        if lo < hi:
            for count, params_buffers in zip(avg_correct, models):
                avg_logits = functional_call(module, params_buffers, (xb[lo:hi],))
                count += (avg_logits.argmax(-1) == yb[lo:hi]).sum()
    module.train(was_training)
    return correct, loss_sum, avg_correct
