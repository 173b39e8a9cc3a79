"""Session fixtures of the flow area."""
