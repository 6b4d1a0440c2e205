# exactly what the report reads (lpdl_core.report.data): no run folder, no model, no torch. With
# `tables: []` the report holds the extension grids alone (their runs, tables and descriptions).
PAPER_INPUTS = (
    dict(
        runs=f"results/{RESULTS}/runs.csv",
        curves=f"results/{RESULTS}/curves.csv",
        tables=expand(TABLE_FILES, results=RESULTS),
        cost=f"results/{RESULTS}/cost.json",
        partitions=f"results/{RESULTS}/partitions.csv",
        paper=PAPER_CSVS,
    )
    if config["tables"]
    else {}
)
REPORT_INPUTS = dict(
    **PAPER_INPUTS,
    # extension grids: each grid's runs, tidy table and description (one report section each)
    grids=[
        f"results/{r}/{name}"
        for r, n in GRID_RESULTS.items()
        for name in ("runs.csv", f"tables/{n}.csv", "grid.json")
    ],
    # compare_modes: the other fidelity mode's results, shown side by side
    compare=(
        [f"results/{COMPARE}/runs.csv", *expand(TABLE_FILES, results=COMPARE)]
        if COMPARE and config["tables"]
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
        "../../envs/report.yaml"
    script:
        "../scripts/report.py"
