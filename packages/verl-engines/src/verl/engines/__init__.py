"""verl engines."""
