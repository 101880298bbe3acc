"""media package."""
