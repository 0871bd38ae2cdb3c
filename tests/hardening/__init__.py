"""Hardening tests."""
