# lpdl: every cell of the paper's tables and figures as a DAG node (workflow/rules/), aggregated
# into results/{profile}/tables/*.csv (results/{profile}-official in the official code's mode) and the report (report/report.html, .tex, .pdf). Default: the mini profile (config/config.yaml).
configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/report.smk"

# cheap steps run where snakemake runs (e.g. a cluster login node), not as SLURM jobs
localrules: aggregate, partitions, report, all


rule all:
    input:
        expand("results/{results}/tables/{table}.csv", results=RESULTS, table=config["tables"]),
        f"{REPORT_DIR}/report.html",
    default_target: True
