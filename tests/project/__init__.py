"""Project tests."""
