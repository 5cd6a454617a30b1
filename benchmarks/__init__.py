"""Benchmarks for petmodel: ``python -m benchmarks.bench_core`` and ``python -m benchmarks.bench_ddp``."""
