"""Between the Snakemake DAG and a training run, in five subpackages, each importing only from the
ones before it: cells (what a cell, a table and a grid are), recipe (a cell, a profile and the
fidelity options -> the library configs of its run), run (one cell or pack -> a run folder),
aggregation (run folders -> tidy frames and per-table CSVs; not named results, which
tools that skip results folders would drop) and workflow (what Snakemake plans: config,
jobs, resources, the bill, the data, locks, status). Everything but a plan's model factory and the
run modules is torch-free, so planning the DAG imports no torch."""
