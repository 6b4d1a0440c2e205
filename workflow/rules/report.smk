# exactly what the report reads (lpdl_core.report.data): no run folder, no model, no torch
REPORT_INPUTS = dict(
    runs=f"results/{RESULTS}/runs.csv",
    curves=f"results/{RESULTS}/curves.csv",
    tables=expand(TABLE_FILES, results=RESULTS),
    cost=f"results/{RESULTS}/cost.json",
    partitions=f"results/{RESULTS}/partitions.csv",
    paper=PAPER_CSVS,
    # extension grids: each grid's runs and description (one report section each)
    grids=[
        f"results/{r}/{name}"
        for r in GRID_RESULTS
        for name in ("runs.csv", "grid.json")
    ],
    # compare_modes: the other fidelity mode's results, shown side by side
    compare=(
        [f"results/{COMPARE}/runs.csv", *expand(TABLE_FILES, results=COMPARE)]
        if COMPARE
        else []
    ),
)
REPORT_OUTPUTS = [
    f"{REPORT_DIR}/report.html",
    f"{REPORT_DIR}/report.tex",
    f"{REPORT_DIR}/claims.json",
]


rule report:
    """The tidy results, Figure 3's cost and the partitions -> {report_dir}/report.html
    (self-contained), report.tex with tables/*.tex and figures, claims.json, and report.pdf when
    latexmk is installed (else the log says why)."""
    input:
        **REPORT_INPUTS,
    output:
        html=report(
            REPORT_OUTPUTS[0], caption="../report/lpdl.rst", category="lpdl report"
        ),
        tex=REPORT_OUTPUTS[1],
        claims=REPORT_OUTPUTS[2],
    log:
        f"results/{RESULTS}/logs/report.log",
    conda:
        "../envs/report.yaml"
    script:
        "../scripts/report.py"
