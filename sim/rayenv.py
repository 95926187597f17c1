"""What a Ray cluster needs to run this project's code: its runtime environment (the sweeps',
the tuner's and a windowed cluster's workers ship the code the same way)."""
from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def ray_runtime_env() -> dict:
    """Ship the project's code (not results, notebooks or git history) to Ray workers."""
    return {"working_dir": str(PROJECT_ROOT),
            "excludes": ["/.git", "/results", "/notebooks", "/docs", "/benchmarks", "/tests",
                         "__pycache__", "*.pyc", ".pytest_cache", ".hypothesis", "/.venv", "*.egg-info"]}
