"""Several replicas on one clock behind a router: cluster specs, replicas, routers, cluster results."""
from sim.cluster.replicas import ClusterResults, parse_cluster, simulate_cluster

__all__ = ["ClusterResults", "parse_cluster", "simulate_cluster"]
