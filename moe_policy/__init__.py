"""moe_policy."""
