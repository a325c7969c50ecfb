"""The ``moe-policy`` command line: ``main`` and one module per command (``add_parser``, ``run``)."""

from moe_policy.cli.app import main

__all__ = ["main"]
