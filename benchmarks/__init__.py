"""Speed benchmarks, run by hand from the repository root: ``python -m benchmarks.run_all``."""
