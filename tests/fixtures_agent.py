"""Session fixtures of the agent area."""
