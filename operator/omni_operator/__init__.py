"""Control plane for omni model deployments: API, planner, renderer, reconciler, operator."""
