# Training jobs: one rule per job of lpdl_core.pipeline.workflow.jobs.plan_jobs (a block's cells of one precision
# in the mini profile, one cell in the paper profile). Every cell keeps its own outputs
# (RUN_DIR/metrics.json, curve.csv, partition.csv), run folder, checkpoint and resume.
#
# A job reruns only when what defines one of its runs changes (params.identity: each cell's
# columns, seed, profile, fidelity); device, executor, threads and paths are not part of it.
# With `executor: distributed` a job runs one process per node: torchrun on this host, or one
# SLURM job of n tasks (`srun -n n`) under the slurm profile (lpdl_core.pipeline.workflow.resources).
# {results} is the fidelity mode's folder (results/mini, results/mini-official): the mode's
# fidelity reaches the job as typed JSON.
# The data and pretrained weights are fetched and verified before any train job starts (download.smk:
# an onstart hook, not an input, so that re-verifying them never hides or reruns a train job); the
# job runs offline.
# Each cell resumes from its checkpoint.pt (not a declared output, so it survives a failed or
# preempted job); a finished copy in .kept/ survives Snakemake's deletion of a failed job's
# outputs, so a rerun restores finished cells instead of recomputing them.

# The paper's jobs write into the mode folders ({results}: results/mini, results/mini-official);
# an extension grid's jobs into the grid's folder only (results/mini-<grid>), their cells found by
# `lpdl train --grid <grid>`.
for _grid, _job in [("", j) for j in JOBS] + [
    (g, j) for g, jobs in GRID_JOBS.items() for j in jobs
]:

    rule:
        name:
            _job.rule
        output:
            # every artifact of every cell: the aggregate step reads metrics.json and curve.csv
            [
                f"{RUN_DIR.replace('{cell}', c)}/{a}"
                for c in _job.cells
                for a in RUN_ARTIFACTS
            ],
        log:
            f"results/{{results}}/logs/train/{_job.name}/seed{{seed}}.log",
        benchmark:
            f"results/{{results}}/benchmarks/train/{_job.name}/seed{{seed}}.tsv"
        wildcard_constraints:
            results=(
                re.escape(grid_folder(RESULTS, _grid))
                if _grid
                else "|".join(re.escape(r) for r in MODES)
            ),
        priority: job_priority(_job)
        conda:
            "../../envs/train.yaml"
        threads: config["threads_per_job"]
        resources:
            # lpdl_core.pipeline.workflow.resources: the same runtime on every attempt (a retry resumes from
            # the checkpoint); GPUs as sbatch --gpus=N or --gres=gpu:N (config gpu_request); with
            # the distributed executor one SLURM job of n tasks (mpi, tasks; the script runs srun)
            **JOB_RESOURCES[_job.name],
        params:
            identity=lambda wc, job=_job: job_identity(job, wc),
            # shell: is evaluated when the job runs, after this loop has ended: everything
            # job-specific must reach it through params, bound now
            cells=list(_job.cells),
            fidelity=fidelity_json,
        script:
            "../scripts/train.py"
