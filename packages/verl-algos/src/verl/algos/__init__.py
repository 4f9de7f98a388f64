"""verl algorithms."""
