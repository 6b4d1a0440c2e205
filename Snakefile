# lpdl: every cell of the paper's tables and figures as a DAG node (its rules, scripts and schema
# under workflow/, the rules' conda environments under envs/), aggregated into
# results/{profile}/tables/*.csv (results/{profile}-official in the official code's mode) and the
# report (report/report.html, .tex, .pdf). Default: the mini profile (config/config.yaml).
from snakemake.utils import min_version

min_version("9")


configfile: "config/config.yaml"


from lpdl_core.pipeline.workflow.hooks import (
    check_results_current,
    planned_rules,
    prefetch_before_training,
    targets_rule,
)


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/preflight.smk"


# cheap steps run where snakemake runs (e.g. a cluster login node), not as SLURM jobs
localrules:
    download,
    aggregate,
    cost,
    partitions,
    report,
    all,


# The report and every file it stands on. Each one is a direct input here, so a file deleted or
# lost (a run folder removed by hand, a failed job's outputs, runs.csv or a table) is rebuilt in
# the same invocation, and everything downstream of it with it: Snakemake does not rebuild a
# missing intermediate file while the targets above it look up to date.
rule all:
    default_target: True
    input:
        long_jobs_check,
        # every run of every folder the config writes: the paper's modes and the grids
        [run_files(results=r) for r in (*MODES, *GRID_RESULTS)],
        *REPORT_INPUTS.values(),
        REPORT_OUTPUTS,


# Before the first job: the data the train jobs load, verified (paper profile). After the default
# target: does the report show exactly what the run folders hold and the config asks for?
# (lpdl_core.pipeline.workflow.hooks; each fails the invocation in one line)
onstart:
    prefetch_before_training(
        profile=PROFILE,
        request=PREFETCH_REQUEST,
        manifest=DOWNLOAD,
        log=DOWNLOAD_LOG,
        planned=planned_rules(workflow),
    )


onsuccess:
    if targets_rule(workflow, "all"):
        check_results_current(
            config, CELLS, {name: grid.cells for name, grid in GRIDS.items()}
        )
