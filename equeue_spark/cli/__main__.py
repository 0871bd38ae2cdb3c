"""``python -m equeue_spark.cli``: the ``equeue`` command."""

from equeue_spark.cli.app import main

if __name__ == "__main__":
    raise SystemExit(main())
