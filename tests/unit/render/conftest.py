"""Renderer tests build plans from the examples; no fixtures needed."""
