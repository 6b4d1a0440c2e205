"""Snakemake script of one training job: `lpdl train` for the job's cells, in a fresh process (so
OMP_NUM_THREADS is set before torch loads), with its stdout and stderr in the job's log.

What defines the runs reaches the job through params (the cells, the mode's fidelity as typed JSON;
params.identity reruns a job when one of its runs changes). How the job runs (device, executor,
compile, fused quantizers, packing,
data root, paper-table folder, threads) comes from the config, so changing it, or the spelling of a
path, never reruns a finished cell. With `executor: distributed` the job runs one process per node
(torchrun started by `lpdl train`, or srun in a SLURM job of n tasks). The job runs offline
(--offline, HF_HUB_OFFLINE=1): the download rule fetched and verified its data and pretrained
weights beforehand."""
import os
import sys

from lpdl_core.pipeline.cells.grids import grid_of_folder
from lpdl_core.pipeline.workflow.wfconfig import job_fidelity_json
from lpdl_core.run_options import RunOptions
from lpdl_core.specs.executors import executor_spec

sm = snakemake  # noqa: F821  (injected by Snakemake)
cfg, seed, results = sm.config, sm.wildcards.seed, sm.wildcards.results
# An extension grid's job writes into its grid's folder (lpdl_core.pipeline.cells.grids.grid_folder);
# the grid is found from that, not from a param, so adding grids never changes the paper jobs'
# params (a params change would rerun every finished cell).
grid = grid_of_folder(results, cfg["profile"], cfg.get("extensions") or ())
# How the job runs (lpdl_core.run_options), from the config's keys; offline: nothing downloads.
options = RunOptions.from_config(cfg, offline=True)
argv = [sys.executable, "-m", "lpdl_core", "train", *(a for c in sm.params.cells for a in ("--cell", c)),
        *(("--grid", grid) if grid else ()),
        # a grid cell whose mini run is a paper cell's reuses the paper's finished run (mini profile)
        *(("--reuse-runs", f"results/{results.removesuffix('-' + grid)}/runs/{{cell}}/seed{seed}")
          if grid and cfg["profile"] == "mini" else ()),
        "--profile", cfg["profile"], "--seed", seed, "--out", f"results/{results}/runs/{{cell}}/seed{seed}",
        *(("--paper-dir", cfg["paper_dir"]) if cfg["paper_dir"] else ()),
        # params: the options that define the runs; the config: those that change only float rounding
        "--fidelity-json", job_fidelity_json(sm.params.fidelity, cfg, results),
        *options.argv()]
os.environ["OMP_NUM_THREADS"] = str(sm.threads)
if executor_spec(options.executor).per_node_process:
    # one process per node: `lpdl train` starts them with torchrun on this host, or, in a SLURM job
    # of n tasks (the slurm profile; resources mpi/tasks), srun starts one per task here
    tasks = int(sm.resources.get("tasks", 1) or 1)
    if tasks > 1 and "SLURM_JOB_ID" in os.environ and int(os.environ.get("SLURM_NTASKS", "1")) >= tasks:
        from lpdl_core.pipeline.workflow.slurm_env import slurm_master_env

        os.environ.update(slurm_master_env())
        os.environ["OMP_NUM_THREADS"] = str(max(1, int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))))
        argv = ["srun", f"--ntasks={tasks}", "--kill-on-bad-exit=1", *argv]
# No train job downloads anything: the download rule fetched and verified it all (lpdl prefetch).
# Hub access off for huggingface_hub, transformers and datasets (lpdl_core.pipeline.workflow.prefetch.OFFLINE_ENV).
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
log = os.open(sm.log[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
sys.stdout.flush()
sys.stderr.flush()
os.dup2(log, 1)
os.dup2(log, 2)
os.execvp(argv[0], argv)  # the job's process becomes the training run (signals reach it directly)
