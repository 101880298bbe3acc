"""Load generator and report for `omni bench` (throughput, latency, time to first token/audio)."""
