"""Qwen2.5-Omni on HF transformers, split into pipeline stages."""
