"""reconcile package."""
