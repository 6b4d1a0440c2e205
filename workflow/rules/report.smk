rule report:
    """Every table's runs -> {report_dir}/report.html (self-contained), report.tex with tables/*.tex
    and figures, claims.json, and report.pdf when latexmk is installed (else the log says why)."""
    input:
        expand("results/{profile}/tables/{table}.csv", profile=PROFILE, table=config["tables"]),
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
