"""The package version, in one place (the root package and the stored runs read it)."""

__version__ = "0.1.0"
