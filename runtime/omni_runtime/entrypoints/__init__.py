"""Process entry points: `omni serve`, `omni stage`, the TP follower ranks and the GPU placement check."""
