"""Datasets (real loaders and embedded stand-ins) and per-node batching."""
from .sampler import NodeSampler

__all__ = ["NodeSampler"]
