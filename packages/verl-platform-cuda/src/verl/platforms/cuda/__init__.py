"""verl platform plugin: cuda."""
