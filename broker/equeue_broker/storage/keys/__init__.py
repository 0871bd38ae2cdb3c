"""The key index (key_index.py) and queries by key and by store time (query.py)."""
