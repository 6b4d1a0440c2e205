"""lpdl_core: decentralized low-precision training with heterogeneous data (Aketi, Kodge, Roy 2021).

Pure library: topologies, partitions, compressors, gossip algorithms and the n-node simulator.
"""
__version__ = "0.1.0"
