"""Delayed delivery: records written once, delivered at their due time (timer.py)."""
