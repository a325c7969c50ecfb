"""Engine adapters. Each imports its engine lazily, so ``import moe_policy`` stays light."""
