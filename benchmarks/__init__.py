"""Benchmarks: plan quality against baselines and bounds, planner latency, API load."""
