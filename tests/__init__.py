"""The test suite, a package so that its shared helpers import as ``tests.<module>``: run it from
the repository root with ``python -m pytest``."""
