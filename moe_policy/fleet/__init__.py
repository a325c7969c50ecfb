"""Cross-rank consistency: comparing decisions of many ranks, and the torch.distributed check."""
