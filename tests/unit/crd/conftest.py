"""CRD tests read the generated CRD and the examples; no fixtures needed."""
