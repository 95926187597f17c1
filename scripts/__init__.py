"""The scripts that draw the docs' figures and tables, run from the repository root as
``python -m scripts.<name>``."""
