"""Rendering of measurements: terminal tables now; HTML, traces and comparisons later."""
