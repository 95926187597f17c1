"""Calibration: measure real step and transfer costs with PyTorch, fit them into profiles, write
analytic roofline profiles, and validate simulated against real serving.

Importing this package does not import torch; the submodules that run the model do
(``model``, ``timing``, ``measure``, ``validate``). ``shapes``, ``fit`` and ``roofline`` are
numpy/scipy only.

Entry points (see docs/calibration.md):
    calibrate.measure.calibrate_profile(device, shape, dtype, grid, out_path, progress=True) -> dict
    calibrate.roofline.write_roofline_profiles(out_dir) -> list[Path]
    calibrate.validate.run_real(profile_path, requests_df, engine_params) -> DataFrame
    calibrate.validate.compare(real_df, sim_df) -> dict
"""

_LAZY = {
    "calibrate_profile": "calibrate.measure",
    "roofline_profile": "calibrate.roofline",
    "write_roofline_profiles": "calibrate.roofline",
    "run_real": "calibrate.validate",
    "compare": "calibrate.validate",
    "validate": "calibrate.against_sim",
}


def __getattr__(name: str):
    """``calibrate.calibrate_profile`` etc., imported on first use (torch only when needed)."""
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'calibrate' has no attribute {name!r}")
