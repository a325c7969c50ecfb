"""vLLM integration: its unquantized fused-MoE selection decided, explained and audited by
the policy. ``plugin.register`` is vLLM's general-plugin entry point; ``selection`` holds the
replacement selector; ``facts`` reads the context from vLLM's objects. vLLM is imported only
when these modules are."""
