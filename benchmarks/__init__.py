"""Benchmarks of the visioncap pipeline; see benchmarks/README.md."""
