"""ServeGen (Alibaba Model Studio) clients: not read row by row but sampled window by window
from each client's rates, burstiness and length distributions (:mod:`workloads.servegen` does
the sampling). Reads the option ``client``.
"""
from __future__ import annotations

from workloads.traceformat import TraceFormat, register_format

register_format("servegen", TraceFormat(None, "a ServeGen client, sampled window by window (workloads.servegen)",
                                        options={"client": None}, per_request=False))
