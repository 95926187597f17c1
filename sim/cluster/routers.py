"""The routers' old home, kept so that ``sim.cluster.routers.BaseRouter`` (and ``ROUTERS``,
``make_router``) still import: the registry and the shipped routers live in :mod:`sim.routers`,
beside the scenario tables whose validation reads them."""
from sim.routers import (ROUTERS, BaseRouter, ClassAware, LeastKV, LeastOutstanding, PowerOfTwo, RoundRobin,
                         counts_router, make_router)

__all__ = ["ROUTERS", "BaseRouter", "ClassAware", "LeastKV", "LeastOutstanding", "PowerOfTwo", "RoundRobin",
           "counts_router", "make_router"]
