"""Library version; part of every decision fingerprint."""

__version__ = "0.1.0"
