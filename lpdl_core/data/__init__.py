"""Datasets (real loaders and embedded stand-ins), verified downloads and per-node batching."""
from .base import ChecksumError, DatasetMissing, DataSplit, data_root
from .registry import DATASETS, PAPER_DATASETS, STANDINS, load_dataset
from .sampler import NodeSampler

__all__ = ["ChecksumError", "DATASETS", "DataSplit", "DatasetMissing", "NodeSampler", "PAPER_DATASETS",
           "STANDINS", "data_root", "load_dataset"]
