"""Spark tests."""
