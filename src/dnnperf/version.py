"""The package version, a leaf: records and caches key on it without importing the package root."""

__version__ = "0.1.0"
