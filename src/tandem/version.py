"""The package version, in a module that imports nothing (checkpoints record it)."""

__version__ = "0.1.0"
