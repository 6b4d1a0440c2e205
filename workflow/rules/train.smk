rule train:
    """One paper cell = one training run. Reruns only when what defines the run changes
    (params.identity: the cell's columns, seed, profile, fidelity); device, executor, threads and
    paths are not part of it. Resumes from checkpoint.pt (not a declared output, so it survives a
    failed or preempted job); a finished copy in .kept/ survives Snakemake's deletion of outputs."""
    output:
        RUN_DIR + "/metrics.json",
    log:
        "results/{profile}/logs/train/{cell}/seed{seed}.log",
    benchmark:
        "results/{profile}/benchmarks/train/{cell}/seed{seed}.tsv"
    params:
        identity=run_identity_of,
    threads: config["threads_per_job"]
    resources:
        mem_mb=lambda wc: train_resources(wc.cell)["mem_mb"],
        runtime=lambda wc, attempt: train_resources(wc.cell)["runtime"] * attempt,
        gpu=lambda wc: train_resources(wc.cell)["gpu"],
    conda:
        "../../envs/lpdl.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m lpdl_core train --cell {wildcards.cell:q} "
        "--profile {wildcards.profile:q} --seed {wildcards.seed:q} --out \"$(dirname {output:q})\" "
        "--paper-dir {PAPER_DIR_Q} --device {DEVICE_Q} --executor {EXECUTOR_Q} {DATA_ROOT_OPT} "
        "--fidelity {FIDELITY_OPT} > {log:q} 2>&1"
