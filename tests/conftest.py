"""Shared test configuration. Fixtures live in one plugin module per area so that areas can
use each other's fixtures (a prepared recipe, the board venv, the virtual board) without copies."""

pytest_plugins = [
    "tests.fixtures_foundation",
    "tests.fixtures_agent",
    "tests.fixtures_board",
    "tests.fixtures_flow",
]
