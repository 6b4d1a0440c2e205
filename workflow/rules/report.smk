rule report:
    """The tidy results, Figure 3's cost and the partitions -> {report_dir}/report.html
    (self-contained), report.tex with tables/*.tex and figures, claims.json, and report.pdf when
    latexmk is installed (else the log says why)."""
    input:
        # exactly what the report reads (lpdl_core.report.data): no run folder, no model, no torch
        runs=f"results/{PROFILE}/runs.csv",
        curves=f"results/{PROFILE}/curves.csv",
        tables=expand(TABLE_FILES, profile=PROFILE),
        cost=f"results/{PROFILE}/cost.json",
        partitions=f"results/{PROFILE}/partitions.csv",
        paper=PAPER_CSVS,
    output:
        html=report(REPORT_DIR + "/report.html", caption="../report/lpdl.rst", category="lpdl report"),
        tex=REPORT_DIR + "/report.tex",
        claims=REPORT_DIR + "/claims.json",
    log:
        f"results/{PROFILE}/logs/report.log",
    conda:
        "../../envs/lpdl.yaml"
    script:
        "../scripts/report.py"
