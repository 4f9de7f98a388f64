"""verl platform plugin: npu."""
