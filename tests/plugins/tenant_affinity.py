"""A router in one file: every request of a tenant goes to the same replica (cache affinity).

Named in a scenario as ``[cluster] router = "tests.plugins.tenant_affinity:TenantAffinity"``, or
registered under a short name with ``sim.routers.ROUTERS.register("tenant_affinity", ...)``.
"""
import zlib

from sim.routers import BaseRouter


class TenantAffinity(BaseRouter):
    """Each tenant to one replica among its candidates, picked by a hash of the tenant's name
    (crc32: the same on every run and machine, unlike Python's salted ``hash``)."""

    name = "tenant_affinity"
    reads_kv = False  # (it reads no replica's state at all)

    def route(self, req, candidates, now_ns):
        return candidates[zlib.crc32(req.tenant.encode()) % len(candidates)]
