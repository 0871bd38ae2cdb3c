"""Broker tests."""
