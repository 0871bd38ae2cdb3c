"""Cli tests."""
