"""Operational endpoints: liveness, readiness and Prometheus metrics."""
