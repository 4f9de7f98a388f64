"""Training that overlaps generation: the one-step off-policy schedule (``async_training.mode``)."""
