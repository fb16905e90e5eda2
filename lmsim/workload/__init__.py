"""Workloads: the canonical trace format, loaders for real trace formats, calibrated
generators, scaling to a target load, and trace statistics."""
