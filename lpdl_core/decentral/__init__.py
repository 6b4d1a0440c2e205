"""Decentralized math, torch on stacked (n, ...) node state and nothing else: graphs and mixing
matrices (topology), data partitions (partition), flat parameter layout (layout), message
compression (compress), the local optimizer (optim), the gossip algorithms (algorithms/) and the
engine that runs n nodes in one process (engine/). Imports only lpdl_core.config and errors."""
