"""One cell or pack -> a run folder: training a plan, the run's identity and strict reading, its lock
and its artifacts."""
