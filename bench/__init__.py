"""Benchmarks: each module has `main(argv) -> int` and prints ratios measured side by side."""
