"""The message log: chunk files, the record format's encoding, placing appends,
sync mode's group commit, and the log by position for replication.
"""
