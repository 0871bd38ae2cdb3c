"""``python -m equeue_spark.console``: the same as ``equeue-console``."""

from equeue_spark.console.app import main

raise SystemExit(main())
