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
