"""The shipped trace formats, one file each; importing this package registers them in
``workloads.traceformat.TRACE_LOADERS`` in the order below (the order ``formats()`` and the
"expected one of" messages list them). A new format is one file here ending in one
``register_format(name, TraceFormat(...))`` call, and its name in this import.
"""
from workloads.formats import azure, mooncake, sharegpt, csv, jsonl, servegen  # noqa: F401  (registers them)
