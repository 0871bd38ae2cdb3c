"""The C extension and the package list; all other metadata is declarative in setup.cfg.

The broker's sources live under ``broker/`` (the design card's top-level folder),
src-layout style: ``broker/equeue_broker/`` is the import package itself, so the
folder name equals the import name for mypy, ruff, IDEs and grep.
"""

from setuptools import Extension, find_packages, setup

setup(
    package_dir={"equeue_broker": "broker/equeue_broker"},
    packages=[
        *find_packages(where="broker", include=["equeue_broker", "equeue_broker.*"]),
        *find_packages(
            include=["equeue_spark", "equeue_spark.*", "equeue_proto", "equeue_proto.*"]
        ),
    ],
    ext_modules=[
        Extension(
            "equeue_proto._codec",
            ["equeue_proto/_codec.c"],
            depends=["equeue_proto/crc32c.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # Without a compiler the pure-Python code paths are used (much slower).
            optional=True,
        ),
        Extension(  # the broker's key index (storage/keys/keyhash.py is its reference)
            "equeue_proto._keyhash",
            ["equeue_proto/_keyhash.c"],
            depends=["equeue_proto/crc32c.h"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
        Extension(  # Avro values to Arrow columns (equeue_spark/client/avro_columns.py)
            "equeue_proto._avro",
            ["equeue_proto/_avro.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        ),
    ],
)
