"""The core demo: Deep-Squeeze and CHOCO-SGD at 0% and 99% compression on an 8-node directed ring
with skew 0.8, on the embedded digits stand-in (not a paper experiment; numbers are a smoke-scale
illustration of the mechanics)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np
import torch

from ..data.base import DataSplit
from ..specs.executors import DEFAULT_EXECUTOR
from ..decentral.algorithms.base import GossipCfg
from ..decentral.compress import CompressorCfg
from ..decentral.engine import EngineCfg
from ..decentral.optim import OptimCfg
from ..decentral.topology import Topology
from ..models import tiny_cnn
from .run_cfg import RunCfg
from .train import RunResult, train


@dataclass(frozen=True)
class DemoRun:
    algorithm: str
    compression: float  # fraction dropped (0.99 = the paper's "99%")
    eta: float


DEFAULT_RUNS = (DemoRun("ds", 0.0, 1.0), DemoRun("choco", 0.0, 1.0),
                DemoRun("ds", 0.99, 0.01), DemoRun("choco", 0.99, 0.01))


def digits_8x8(test_fraction: float = 0.2, seed: int = 0) -> DataSplit:
    """scikit-learn's 1,797 real 8x8 digits as 1-channel uint8 images (the demo's data only)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = np.round(d.images * (255.0 / 16.0)).astype(np.uint8)[:, None]
    xtr, xte, ytr, yte = train_test_split(x, d.target.astype(np.int64), test_size=test_fraction,
                                          stratify=d.target, random_state=seed)
    m, sd = float(xtr.mean() / 255.0), float(xtr.std() / 255.0)
    t = torch.from_numpy
    return DataSplit(name="digits-8x8", kind="image", num_classes=10, x_train=t(xtr), y_train=t(ytr),
                     x_test=t(xte), y_test=t(yte), mean=(m,), std=(sd,), augment="none", image_size=8,
                     description="scikit-learn load_digits, 8x8 grey, demo only (not a paper dataset)")


def run_demo(*, epochs: int = 8, nodes: int = 8, skew: float = 0.8, graph: str = "directed-ring",
             executor: str = DEFAULT_EXECUTOR, device: str = "auto", runs: Iterable[DemoRun] = DEFAULT_RUNS,
             progress: Callable[[DemoRun, dict], None] | None = None) -> list[tuple[DemoRun, RunResult]]:
    split = digits_8x8()
    topo = Topology(name=graph, n=nodes)
    out = []
    for r in runs:
        comp = CompressorCfg.top_k(r.compression)
        result = train(
            lambda: tiny_cnn(1, 10), split, topology=topo,
            gossip=GossipCfg(algorithm=r.algorithm, eta=r.eta, compressor=comp),
            optim_cfg=OptimCfg(), engine=EngineCfg(executor=executor, device=device),
            run=RunCfg(epochs=epochs, batch_size=16, lr=0.1, skew=skew, final_gossip_rounds=50),
            progress=(lambda ev, r=r: progress(r, ev)) if progress else None)
        out.append((r, result))
    return out


def format_table(results: list[tuple[DemoRun, RunResult]]) -> str:
    head = (f"{'algorithm':<9} {'compr.':>6} {'eta':>5} {'mean node acc':>13} {'avg-model acc':>13} "
            f"{'consensus':>9} {'MB/node':>8} {'status':>8}")
    lines = [head, "-" * len(head)]
    for r, res in results:
        f = res.final
        lines.append(f"{r.algorithm:<9} {r.compression:>6.0%} {r.eta:>5g} {f['mean_acc']:>12.2f}% "
                     f"{f['avg_model_acc']:>12.2f}% {f['consensus_distance']:>9.3f} "
                     f"{res.bytes_per_node / 1e6:>8.3f} {res.status:>8}")
    return "\n".join(lines)
