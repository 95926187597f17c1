"""``python -m calibrate``: measure a profile without the priosim CLI (same arguments).

    python -m calibrate --device cpu --shape tiny --grid quick --out p.json
    python -m calibrate roofline [--grid shipped|fidelity|all] [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import sys


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
        for p in write_roofline_profiles(a.out_dir or PROFILE_DIR, grid=GRIDS[a.grid]):
            print(p)
        return 0
    ap = argparse.ArgumentParser(prog="python -m calibrate")
    ap.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--dtype", default=None, help="fp32 | bf16 | fp16 (default: fp32 on CPU, bf16 on CUDA)")
    ap.add_argument("--grid", default="quick", choices=["quick", "full"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-cuda-graphs", action="store_true")
    a = ap.parse_args(argv)
    from calibrate.measure import calibrate_profile
    calibrate_profile(a.device, a.shape, a.dtype, a.grid, a.out, progress=True,
                      cuda_graphs=False if a.no_cuda_graphs else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
