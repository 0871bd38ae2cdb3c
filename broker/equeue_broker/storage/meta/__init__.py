"""The metadata files: topics, consumer-group offsets, name rules, and the
atomic JSON file and data-directory lock they rest on.
"""
