"""One spec per kind, torch-free: every fact the planner, the cells, the bill and the report need
about an executor (executors.py), a gossip compressor (compressors.py), a decentralized algorithm
(algorithms.py), a model (models.py) or a fidelity option's values (fidelity.py), written once.
Each kind's implementation registers under the same name (a test holds each spec and its
implementation together), and code asks the spec what a kind can do instead of comparing its name."""
