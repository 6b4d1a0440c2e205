rule aggregate:
    """All runs of one paper table -> results/{profile}/tables/{table}.csv (reproduced, paper,
    delta, seeds mean/std; missing and diverged cells marked, never filled). Every run is read
    from its own folder and its identity checked."""
    input:
        lambda wc: metrics_of(wc.table),
    output:
        "results/{profile}/tables/{table}.csv",
    log:
        "results/{profile}/logs/aggregate/{table}.log",
    conda:
        "../../envs/lpdl.yaml"
    script:
        "../scripts/aggregate.py"
