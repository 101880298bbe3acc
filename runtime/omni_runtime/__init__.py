"""Data plane for omni models: stage pipeline, OpenAI-compatible API, router, benchmarks."""
