"""Shared machinery of the benchmark harness (bench/run.py): Azurite, measurement, peers, workloads, reports."""
