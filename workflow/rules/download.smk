# Prefetch, then offline jobs. Before the first train job starts, Snakemake itself (where it runs,
# e.g. a cluster login node that reaches the internet) fetches and verifies every dataset and
# pretrained hub model the cells' runs load (`lpdl prefetch`, lpdl_core.pipeline.workflow.prefetch: derived
# from each cell's plan) into the data root and the Hugging Face cache, and records what it verified
# in results/{profile}/download.json. Every train job runs offline (workflow/scripts/train.py:
# `lpdl train --offline`, HF_HUB_OFFLINE=1): no train job downloads.
#
# That step is the Snakefile's `onstart` hook (lpdl_core.pipeline.workflow.hooks.prefetch_before_training, which
# says why it is no job upstream of the train jobs). It runs only when train jobs are about to run
# and the manifest does not already record this request (profile, tables, cells folder, data root,
# fidelity modes); it fails the whole run in one line before any job starts when something cannot be
# fetched or verified. The mini profile loads only embedded stand-ins, so it has nothing to fetch.
#
# `snakemake download` does the same on its own (e.g. before a long queue wait).

from lpdl_core.pipeline.workflow.prefetch import (
    prefetch_request,
    request_args,
)  # noqa: E402

DOWNLOAD = f"results/{RESULTS}/download.json"
DOWNLOAD_LOG = f"results/{RESULTS}/logs/download.log"
# What decides what is fetched: the tables' cells, every fidelity mode's plans (compare_modes
# included), where the data goes; paths normalized, so another spelling is no change.
PREFETCH_REQUEST = prefetch_request(
    profile=PROFILE,
    tables=config["tables"],
    paper_dir=config["paper_dir"],
    data_root=config["data_root"],
    fidelities=[f.as_dict() for f in MODES.values()],
)


rule download:
    """Fetch and verify what the train jobs load: `snakemake download` alone (docs/slurm.md,
    'Prefetch, then offline jobs'). A run of train jobs does the same first (the onstart hook).
    """
    output:
        DOWNLOAD,
    log:
        DOWNLOAD_LOG,
    conda:
        "../../envs/train.yaml"
    params:
        args=request_args(PREFETCH_REQUEST),
    shell:
        "python -m lpdl_core prefetch {params.args:q} --out {output:q} > {log:q} 2>&1"
