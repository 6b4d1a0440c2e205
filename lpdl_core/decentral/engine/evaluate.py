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
    n = sim.n
    correct = torch.zeros(n, device=sim.device)
    loss_sum = torch.zeros(n, device=sim.device)
    avg_correct = torch.zeros((), device=sim.device)
    module = sim.executor.reference_module()
    avg_params = dict(zip(sim.layout.names, sim.layout.views(sim.average)))
    # The averaged model also takes the node average of floating buffers (activation ranges,
    # running statistics); integer counters come from node 0.
    avg_buffers = {k: b.mean(0) if b.is_floating_point() else b[0]
                   for k, b in sim.executor.stacked_buffers().items()}
    was_training = module.training
    module.eval()
    for s in range(0, len(x), batch_size):
        xb, yb = x[s:s + batch_size], y[s:s + batch_size]
        if transform is not None:
            xb = transform(xb)
        logits = sim.executor.logits(xb)  # (n, B, C)
        correct += (logits.argmax(-1) == yb).sum(1)
        loss_sum += torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), yb.repeat(n), reduction="none").view(n, -1).sum(1)
        avg_logits = functional_call(module, (avg_params, avg_buffers), (xb,))
        avg_correct += (avg_logits.argmax(-1) == yb).sum()
    module.train(was_training)
    acc = (100.0 * correct / len(x)).tolist()
    return Evaluation(node_acc=tuple(acc), mean_acc=sum(acc) / n,
                      avg_model_acc=float(100.0 * avg_correct / len(x)),
                      consensus_distance=sim.consensus_distance(),
                      mean_loss=float(loss_sum.mean() / len(x)))
