"""Client tests."""
