"""Transactions: the protocol, their begin, commit and abort records, a commit's
writes, and reading them back from the log at open.
"""
