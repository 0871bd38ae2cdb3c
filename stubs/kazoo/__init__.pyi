# Narrow type stubs for the part of kazoo (no type hints of its own) that
# equeue_broker.cluster uses; mypy reads them through mypy_path (pyproject.toml).
