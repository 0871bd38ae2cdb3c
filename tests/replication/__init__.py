"""Replication tests."""
