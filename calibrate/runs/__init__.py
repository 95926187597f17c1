"""Real benchmark results (vLLM, GuideLLM, SGLang, genai-perf): read them into one table
(:mod:`calibrate.runs.table`), replay them as priosim scenarios (:mod:`calibrate.runs.scenario`)
and compare measured with simulated (:mod:`calibrate.runs.compare`); :mod:`calibrate.runs.export`
writes a simulated run back in each client's schema. No torch. docs/replay.md.

    from calibrate.runs import read_run, replay
    cmp = replay(read_run("run.json"), ["engine.max_num_seqs=64"], profile="h100-sxm-llama-3-8b")
    cmp.metrics["ttft_p50_ms"]   # {"measured": ..., "simulated": ..., "error": ...}
"""
from calibrate.runs.table import RUN_FORMATS, Run, RunError, read_run, read_runs
from calibrate.runs.compare import Comparison, replay

__all__ = ["RUN_FORMATS", "Run", "RunError", "read_run", "read_runs", "Comparison", "replay"]
