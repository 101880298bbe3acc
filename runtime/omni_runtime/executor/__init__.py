"""The executor: model-agnostic machinery a family adapter drives (slot KV cache, batched
sampling, tensor parallelism, the image encoder's own stage process)."""
