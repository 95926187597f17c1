"""Several replicas on one clock behind a router: the cluster's layout (``spec``), its
machinery (``replicas``), routers, running it (``driver``) and its results (``results``)."""
from sim.cluster.driver import simulate_cluster
from sim.cluster.results import ClusterResults, cluster_json
from sim.cluster.spec import ClusterSpec, GroupSpec, parse_cluster

__all__ = ["ClusterResults", "ClusterSpec", "GroupSpec", "cluster_json", "parse_cluster", "simulate_cluster"]
