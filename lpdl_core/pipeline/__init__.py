"""Pipeline glue between the Snakemake DAG and a training run: the paper's cells (cells), the mini
protocol (mini), how cells group into jobs (jobs), one cell -> one run (runcell) with its atomic
artifacts and identity checks (results, runstore), the tidy frames and per-table CSVs (tidy,
aggregate), table shapes and display names (shapes), learning targets and timing, the partition
figures' data and the stale-lock helper. Everything but runcell is torch-free, so planning the DAG
imports no torch."""
