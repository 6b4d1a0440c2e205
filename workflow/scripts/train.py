"""Snakemake script of one training job: `lpdl train` for the job's cells, in a fresh process (so
OMP_NUM_THREADS is set before torch loads), with its stdout and stderr in the job's log.

What defines the runs reaches the job through params (the cells, the mode's fidelity as typed JSON;
params.identity reruns a job when one of its runs changes). How the job runs (device, executor,
data root, paper-table folder, threads) comes from the config, so changing it, or the spelling of a
path, never reruns a finished cell. The job runs offline (--offline, HF_HUB_OFFLINE=1): the
download rule fetched and verified its data and pretrained weights beforehand."""
import os
import sys

sm = snakemake  # noqa: F821  (injected by Snakemake)
cfg, seed, results = sm.config, sm.wildcards.seed, sm.wildcards.results
argv = [sys.executable, "-m", "lpdl_core", "train", *(a for c in sm.params.cells for a in ("--cell", c)),
        "--profile", cfg["profile"], "--seed", seed, "--out", f"results/{results}/runs/{{cell}}/seed{seed}",
        *(("--paper-dir", cfg["paper_dir"]) if cfg["paper_dir"] else ()), "--device", cfg["device"], "--executor", cfg["executor"],
        *(("--data-root", cfg["data_root"]) if cfg["data_root"] else ()), "--fidelity-json", sm.params.fidelity,
        "--offline"]
os.environ["OMP_NUM_THREADS"] = str(sm.threads)
# No train job downloads anything: the download rule fetched and verified it all (lpdl prefetch).
# Hub access off for huggingface_hub, transformers and datasets (lpdl_core.pipeline.prefetch.OFFLINE_ENV).
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
log = os.open(sm.log[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
sys.stdout.flush()
sys.stderr.flush()
os.dup2(log, 1)
os.dup2(log, 2)
os.execv(sys.executable, argv)  # the job's process becomes the training run (signals reach it directly)
