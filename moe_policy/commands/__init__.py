"""The ``moe-policy`` subcommands: one module per command (``add_parser``, ``run``)."""
