"""Run folders -> tidy frames (runs.csv, curves.csv) and per-table CSVs, learning targets, timing, the
partition figures' data (torch-free)."""
