# Prefetch, then offline jobs: one `download` job (a local rule: it runs where Snakemake runs, e.g.
# a cluster login node that reaches the internet) fetches and verifies every dataset and pretrained
# hub model the cells' runs load (`lpdl prefetch`, lpdl_core.pipeline.prefetch: derived from each cell's
# plan) into the data root and the Hugging Face cache. Every train job waits for it and runs offline
# (workflow/scripts/train.py: `lpdl train --offline`, HF_HUB_OFFLINE=1): no train job downloads.
#
# The manifest lives in the results folder, not the data root: the data root may be shared (read-only,
# or by other checkouts and profiles on a cluster filesystem), while what this workflow verified, and
# Snakemake's record of it, belongs to this run. A second verification of a shared data root is cheap.
# Train jobs read it as ancient(): re-running the download job (its params changed: other tables,
# data root or modes) never reruns a finished cell.

import os

DOWNLOAD = f"results/{RESULTS}/download.json"


# What decides what is fetched, as `lpdl prefetch` options: the tables' cells, every fidelity mode's
# plans (compare_modes included), where the data goes.
PREFETCH_ARGS = [
    *(a for t in config["tables"] for a in ("--table", t)),
    # normalized: another spelling of the same folder ("small/", "./small") is no change
    *(("--paper-dir", os.path.normpath(config["paper_dir"])) if config["paper_dir"] else ()),
    *(("--data-root", os.path.normpath(config["data_root"])) if config["data_root"] else ()),
    *(a for f in MODES.values() for a in ("--fidelity-json", json.dumps(f.as_dict(), sort_keys=True))),
]


rule download:
    """Fetch and verify what the train jobs load, once, before them: `snakemake download` alone
    (docs/slurm.md, 'Prefetch, then offline jobs'). The mini profile's data is embedded: its
    manifest says so and nothing is fetched."""
    output:
        DOWNLOAD,
    params:
        profile=PROFILE,
        args=PREFETCH_ARGS,
    log:
        f"results/{RESULTS}/logs/download.log",
    conda:
        "../envs/train.yaml"
    shell:
        "python -m lpdl_core prefetch --profile {params.profile:q} {params.args:q} --out {output:q} "
        "> {log:q} 2>&1"
