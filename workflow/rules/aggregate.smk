rule aggregate:
    """Every run, read once from its own folder (identity checked) -> the tidy frames: runs.csv
    (one row per cell and seed), curves.csv (one row per cell, seed and epoch), and per paper
    table tables/{table}.csv (one row per cell: groupby over seeds, missing and diverged cells
    marked, never filled) and tables/{table}-paper.csv (the paper's shape). lpdl_core.pipeline.aggregation.aggregate.
    The cells CSVs are inputs too: the tables copy their paper values.
    """
    input:
        run_files,
        PAPER_CSVS,
    output:
        runs="results/{results}/runs.csv",
        curves="results/{results}/curves.csv",
        tables=TABLE_FILES,
    log:
        "results/{results}/logs/aggregate.log",
    conda:
        "../../envs/aggregate.yaml"
    params:
        fidelity=lambda wc: MODES[wc.results].as_dict(),
    script:
        "../scripts/aggregate.py"


# An extension grid's runs -> results/<profile>-<grid>/runs.csv, curves.csv and tables/<grid>.csv
# (one row per cell; lpdl_core.pipeline.aggregation.aggregate), as for a paper table. One rule per grid.
for _results, _grid in GRID_RESULTS.items():

    rule:
        name:
            f"aggregate_{_grid.replace('-', '_')}"
        input:
            run_files(results=_results),
            # the spec: grid.json holds its description, axes and labels
            str(grid_path(_grid)),
        output:
            runs=f"results/{_results}/runs.csv",
            curves=f"results/{_results}/curves.csv",
            table=f"results/{_results}/tables/{_grid}.csv",
            grid=f"results/{_results}/grid.json",
        log:
            f"results/{_results}/logs/aggregate.log",
        localrule: True
        conda:
            "../../envs/aggregate.yaml"
        params:
            fidelity=FIDELITY_OF[_results].as_dict(),
            grid=_grid,
        script:
            "../scripts/aggregate.py"


rule cost:
    """Figure 3's numbers: the analytic compute and memory cost model of ResNet-20, counted on the
    real model, a few seconds on a CPU. A local rule (no GPU job): peak CUDA memory is measured too
    only where Snakemake itself runs on a GPU machine. lpdl_core.training.cost.
    """
    output:
        "results/{results}/cost.json",
    log:
        "results/{results}/logs/cost.log",
    conda:
        "../../envs/train.yaml"
    shell:
        "python -m lpdl_core cost --device auto --out {output:q} > {log:q} 2>&1"


rule partitions:
    """Figures 2, 5-7's numbers: per-node class counts of the official skew partition of each
    paper dataset's training set. lpdl_core.pipeline.aggregation.paper_partitions."""
    output:
        "results/{results}/partitions.csv",
    log:
        "results/{results}/logs/partitions.log",
    conda:
        "../../envs/train.yaml"
    shell:
        "python -m lpdl_core partition-figures --out {output:q} > {log:q} 2>&1"
