"""Cluster tests."""
