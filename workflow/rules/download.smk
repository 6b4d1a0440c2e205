# Prefetch, then offline jobs. Before the first train job starts, Snakemake itself (where it runs,
# e.g. a cluster login node that reaches the internet) fetches and verifies every dataset and
# pretrained hub model the cells' runs load (`lpdl prefetch`, lpdl_core.pipeline.prefetch: derived
# from each cell's plan) into the data root and the Hugging Face cache, and records what it verified
# in results/{profile}/download.json. Every train job runs offline (workflow/scripts/train.py:
# `lpdl train --offline`, HF_HUB_OFFLINE=1): no train job downloads.
#
# Why an `onstart` hook and not a job upstream of the train jobs: Snakemake does not evaluate jobs
# downstream of a job that must rerun. A manifest read as ancient() by the train jobs therefore hid
# every train job whenever the download job reran (other tables, modes or data root): such a run
# ran only the download and said "100% done". A plain input would instead rerun every finished
# cell. The hook runs in the Snakemake process after the DAG is planned and before any job; the
# train jobs need no edge to it, so each of them reruns exactly when its own run changes.
# It only runs when train jobs are about to run and the manifest does not already record this
# request (profile, tables, cells folder, data root, fidelity modes); it fails the whole run in one
# line before any job starts when something cannot be fetched or verified. The mini profile loads
# only embedded stand-ins, so it has nothing to fetch.
#
# `snakemake download` does the same on its own (e.g. before a long queue wait).

import subprocess

from lpdl_core.pipeline.prefetch import manifest_serves, prefetch_request, request_args  # noqa: E402

DOWNLOAD = f"results/{RESULTS}/download.json"
DOWNLOAD_LOG = f"results/{RESULTS}/logs/download.log"
# What decides what is fetched: the tables' cells, every fidelity mode's plans (compare_modes
# included), where the data goes; paths normalized, so another spelling is no change.
PREFETCH_REQUEST = prefetch_request(profile=PROFILE, tables=config["tables"], paper_dir=config["paper_dir"],
                                    data_root=config["data_root"],
                                    fidelities=[f.as_dict() for f in MODES.values()])


rule download:
    """Fetch and verify what the train jobs load: `snakemake download` alone (docs/slurm.md,
    'Prefetch, then offline jobs'). A run of train jobs does the same first (onstart, below)."""
    output:
        DOWNLOAD,
    params:
        args=request_args(PREFETCH_REQUEST),
    log:
        DOWNLOAD_LOG,
    conda:
        "../envs/train.yaml"
    shell:
        "python -m lpdl_core prefetch {params.args:q} --out {output:q} > {log:q} 2>&1"


def _trains_anything() -> bool:
    """Whether the planned jobs include a train job (True when Snakemake's plan cannot be read)."""
    try:
        return any(job.rule.name.startswith("train_") for job in workflow.dag.needrun_jobs())
    except Exception:  # noqa: BLE001  (an internal of Snakemake: when in doubt, verify)
        return True


def prefetch_before_training() -> None:
    if PROFILE == "mini" or not _trains_anything() or manifest_serves(DOWNLOAD, PREFETCH_REQUEST):
        return
    sys.stderr.write(f"lpdl: fetching and verifying the data the cells load, before any train job "
                     f"(log: {DOWNLOAD_LOG})\n")
    Path(DOWNLOAD_LOG).parent.mkdir(parents=True, exist_ok=True)
    with open(DOWNLOAD_LOG, "w") as log:
        rc = subprocess.run([sys.executable, "-m", "lpdl_core", "prefetch", *request_args(PREFETCH_REQUEST),
                             "--out", DOWNLOAD], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL).returncode
    if rc:
        text = Path(DOWNLOAD_LOG).read_text(errors="replace").splitlines()
        errors = [l for l in text if l.startswith("lpdl prefetch: error:")]
        sys.stderr.write((errors[-1] if errors else f"lpdl prefetch: error: failed (exit {rc}); see {DOWNLOAD_LOG}")
                         + "\n")
        raise SystemExit(1)  # before any job: nothing was started


onstart:
    prefetch_before_training()
