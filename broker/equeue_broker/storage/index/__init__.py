"""The queue indexes: index chunk files, one open queue's state, and rebuilding
a damaged entry from the log.
"""
