"""Smoke runs of the benchmarks in bench/ (issue 31)."""
