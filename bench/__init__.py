"""Benchmarks of torch +um against stock torch, run on a GPU host (bench/README.md)."""
