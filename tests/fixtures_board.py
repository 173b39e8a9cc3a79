"""Session fixtures of the board area."""
