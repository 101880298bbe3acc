"""Planner tests are pure: no fixtures beyond the spec builders in spec_builders.py."""
