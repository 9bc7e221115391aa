"""Benchmarks and the chaos runner (python -m bench.chaos)."""
