"""The shipped trace formats, one file each: importing this package imports every module in it,
and each format's module ends in one ``register_format(name, TraceFormat(...))`` call
(``workloads.traceformat.TRACE_LOADERS``). So a new format is one file here, nothing else.

The formats of ``ORDER`` register first, in that order (the order ``formats()`` and the
"expected one of" messages list them), then any other module, by name. A module that registers
nothing (``mapped``: the columns mapping ``csv`` and ``jsonl`` share) is imported all the same.
"""
import importlib
import pkgutil

ORDER = ("azure", "mooncake", "sharegpt", "csv", "jsonl", "servegen")

for _name in [*ORDER, *sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in ORDER)]:
    importlib.import_module(f"{__name__}.{_name}")
del _name
