"""local package."""
