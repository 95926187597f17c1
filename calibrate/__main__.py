"""``python -m calibrate``: measure a profile without the priosim CLI (same arguments).

    python -m calibrate --device cpu --shape tiny --grid quick --out p.json [--overwrite]
    python -m calibrate roofline [--grid shipped|fidelity|all] [--out-dir DIR]

Bad input (a shape, device or dtype it does not know, an ``--out`` that exists without
``--overwrite``) stops before any measurement with one line and exit status 2, as ``priosim
calibrate`` does.
"""
from __future__ import annotations

import argparse
import re
import sys

EXIT_BAD_INPUT = 2


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["roofline"]:
        from calibrate.roofline import GRIDS, PROFILE_DIR, write_roofline_profiles
        ap = argparse.ArgumentParser(prog="python -m calibrate roofline")
        ap.add_argument("--out-dir", default=None)
        ap.add_argument("--grid", default="shipped", choices=list(GRIDS),
                        help="shipped: the profiles scenarios name; fidelity: those the fidelity suite "
                             "needs for other models' published measurements; all: both")
        a = ap.parse_args(argv[1:])
        try:
            for p in write_roofline_profiles(a.out_dir or PROFILE_DIR, grid=GRIDS[a.grid]):
                print(p)
        except OSError as exc:  # (a folder that cannot be made or written: one line, no traceback)
            return _fail(f"--out-dir {a.out_dir or PROFILE_DIR}: cannot write the profiles: "
                         f"{exc.strerror or exc} (expected a writable folder)")
        return 0
    ap = argparse.ArgumentParser(prog="python -m calibrate")
    ap.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--grid", default="quick", choices=["quick", "full"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--overwrite", action="store_true", help="replace the file --out names")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    a = ap.parse_args(argv)
    # (checked before torch is imported and anything is measured: a quick grid takes minutes)
    from calibrate.shapes import get_shape
    from sim.core.errors import error_message
    from sim.outdir import OutError, claim_file

    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", a.device):
        return _fail(f"--device: {a.device!r} is not a device (expected cpu, cuda, cuda:N or auto)")
    if a.dtype is not None and a.dtype not in ("fp32", "bf16", "fp16"):
        return _fail(f"--dtype: {a.dtype!r} is not a dtype (expected fp32, bf16 or fp16)")
    try:
        get_shape(a.shape)
        claim_file(a.out, overwrite=a.overwrite)
    except KeyError as exc:
        return _fail(f"--shape: {error_message(exc)}")
    except OutError as exc:
        return _fail(error_message(exc))
    from calibrate.measure import calibrate_profile
    try:
        calibrate_profile(a.device, a.shape, a.dtype, a.grid, a.out, progress=True,
                          cuda_graphs=False if a.no_cuda_graphs else None)
    except RuntimeError as exc:  # (no CUDA device: the one thing known only once torch looks)
        return _fail(f"--device {a.device}: {error_message(exc)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
