"""What Snakemake plans: the workflow config, jobs, runtimes and resources, the bill, the data to
fetch, the preflight, hooks, locks and status."""
