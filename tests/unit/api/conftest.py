"""Loader tests parse YAML text directly; no fixtures needed."""
