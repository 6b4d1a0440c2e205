rule demo:
    """The core demo (DS vs CHOCO at 0% and 99% on embedded digits): `snakemake -c2 demo`."""
    output:
        "results/demo/table.txt",
    log:
        "results/demo/demo.log",
    conda:
        "../../envs/train.yaml"
    threads: 2
    params:
        epochs=config["demo"]["epochs"],
        nodes=config["demo"]["nodes"],
        skew=config["demo"]["skew"],
    shell:
        "python -m lpdl_core demo --quiet --epochs {params.epochs:q} --nodes {params.nodes:q} "
        "--skew {params.skew:q} > {output:q} 2> {log:q}"
