"""verl platform plugin: rocm."""
