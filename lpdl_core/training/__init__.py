"""One training run: the learning-rate schedule, the epoch loop over the engine with evaluation,
divergence checks and checkpoints (train), and what is measured about a run without running a
cell: step benchmarks (bench), Figure 3's cost model (cost), the demo. Builds on decentral,
models, quant and data; knows nothing of cells, profiles or the pipeline."""
