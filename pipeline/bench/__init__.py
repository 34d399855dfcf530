"""Benchmarks: each writes its figures under reports/ (python -m pipeline.bench.NAME)."""
