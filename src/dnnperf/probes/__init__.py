"""Probes observe a training step without changing what it computes; each removes what it added."""
