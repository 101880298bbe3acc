"""Local-mode unit tests are pure: the rollout decision and Plan -> process specs, no processes."""
