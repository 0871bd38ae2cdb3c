"""Backlog alarms evaluated by the console (design 30, section 3): rules.py
reads the rules, engine.py turns snapshots into transitions (pure)."""
