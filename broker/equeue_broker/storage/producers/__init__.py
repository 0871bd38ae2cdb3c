"""Idempotent producers' state: which batches each producer id appended, per queue.

``records.py`` specifies the control record written with every idempotent
batch; ``table.py`` keeps the state derived from those records (at runtime,
at recovery and on replicas alike).
"""
