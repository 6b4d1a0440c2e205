"""A cell, a profile and the fidelity options -> the library configs of its run: the plan, the mini
protocol, packing, the official run.sh's settings."""
