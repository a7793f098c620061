"""Analyses over workloads and run records."""
