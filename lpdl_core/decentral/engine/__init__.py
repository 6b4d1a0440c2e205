"""The n-node decentralized training simulator (one process, all nodes on one device), and the
distributed executor (one process per node, `NodeProcess`)."""
from .distributed import NodeProcess
from .evaluate import Evaluation, evaluate, evaluate_cells
from .executors import BatchedExecutor, LoopExecutor
from .engine_cfg import EngineCfg, resolve_device
from .simulator import Simulator

__all__ = ["BatchedExecutor", "EngineCfg", "Evaluation", "LoopExecutor", "NodeProcess",
           "Simulator", "evaluate", "evaluate_cells", "resolve_device"]
