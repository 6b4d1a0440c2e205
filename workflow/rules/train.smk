rule train:
    """One paper cell = one training run (resumes from results/.../checkpoint.pt, which is not a
    declared output and so survives a failed or preempted job)."""
    output:
        RUN_DIR + "/metrics.json",
    log:
        "results/{profile}/logs/train/{cell}/seed{seed}.log",
    benchmark:
        "results/{profile}/benchmarks/train/{cell}/seed{seed}.tsv"
    params:
        out=lambda wc: RUN_DIR.format(profile=wc.profile, cell=wc.cell, seed=wc.seed),
        paper_dir=config["paper_dir"],
        device=config["device"],
        executor=config["executor"],
        data_root=lambda wc: f"--data-root {config['data_root']}" if config["data_root"] else "",
        fidelity=fidelity_args(),
    threads: config["threads_per_job"]
    resources:
        mem_mb=lambda wc: train_resources(wc.cell)["mem_mb"],
        runtime=lambda wc, attempt: train_resources(wc.cell)["runtime"] * attempt,
        gpu=lambda wc: train_resources(wc.cell)["gpu"],
    conda:
        "../../envs/lpdl.yaml"
    shell:
        "OMP_NUM_THREADS={threads} python -m lpdl_core train --cell {wildcards.cell:q} "
        "--profile {wildcards.profile:q} --seed {wildcards.seed} --out {params.out:q} "
        "--paper-dir {params.paper_dir:q} --device {params.device:q} --executor {params.executor:q} "
        "{params.data_root} --fidelity {params.fidelity} > {log:q} 2>&1"
