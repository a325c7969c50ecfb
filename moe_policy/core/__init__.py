"""The decision path, free of torch: context vocabulary and context, origins, YAML loading,
model facts, the platform probe, the backend catalog, policy rules, the resolver and its
passes, the decision record. Nothing here imports a layer above it."""
