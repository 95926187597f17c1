"""The per-step core of one replica: engine (plan / price / apply), decode cohort, KV pool,
prefix cache, requests and their source, the replica loop, the cost model with its profiles and
engine overheads, the fairness accountant and telemetry. Imports nothing above it in ``sim``."""
