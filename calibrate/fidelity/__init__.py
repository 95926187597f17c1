"""The fidelity suite: published measurements of real serving engines, each reproduced by a
generated scenario (``suite``), the engine-overhead fit (``fit``) and the report (``report``).

``priosim fidelity`` (or ``python -m benchmarks.fidelity``) runs every row and writes
docs/fidelity.md with a parity plot; ``python -m calibrate.fidelity.fit`` refits the presets.
"""
