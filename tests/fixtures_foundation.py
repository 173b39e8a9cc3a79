"""Session fixtures of the foundation area."""
