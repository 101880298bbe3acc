"""Qwen3-Omni-MoE (Qwen3-Omni-30B-A3B) in the builtin runtime."""
