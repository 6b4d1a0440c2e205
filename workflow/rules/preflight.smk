# Before the bill: `snakemake --profile slurm --configfile config/paper.yaml preflight` runs
# `lpdl preflight` as one GPU job on the cluster (lpdl_core.pipeline.workflow.preflight). It measures each
# job shape of this config's plan (step time, data loader, peak host and device memory, compile
# time) on the node the train jobs will get. It writes results/{profile}/preflight/step-times.yaml,
# which `lpdl plan --config step_times=FILE` and the workflow's step_times key read, and
# verdicts.txt, one line per shape. The data is fetched and verified first (the download rule,
# where Snakemake runs). Not part of rule all: a target of its own. The config's optional
# `preflight:` mapping narrows it (`shapes`: texts a shape's name must hold) or sets `steps`,
# `warmup`, `timeout` (seconds per shape).

from lpdl_core.pipeline.workflow import preflight as _preflight  # noqa: E402

PREFLIGHT = f"results/{RESULTS}/preflight"


rule preflight:
    """Each job shape of the plan measured on the job's device; exit 0 also when a shape will not
    fit (verdicts.txt says which, and the step-times file holds what was measured)."""
    input:
        DOWNLOAD,
    output:
        times=f"{PREFLIGHT}/step-times.yaml",
        verdicts=f"{PREFLIGHT}/verdicts.txt",
        config=f"{PREFLIGHT}/config.yaml",
    log:
        f"results/{RESULTS}/logs/preflight.log",
    conda:
        "../../envs/train.yaml"
    resources:
        **_preflight.rule_resources(config, CELLS, PLANNER),
    params:
        args=_preflight.cli_args(config),
    script:
        "../scripts/preflight.py"
