"""The package version, in one place (tfbigconv.__version__, autotune's cache)."""
__version__ = "0.1.0"
