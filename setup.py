"""The C extension and the package list; all other metadata is declarative in setup.cfg.

The folder ``broker/`` installs as the import package ``equeue_broker`` (PyPI's
``broker`` is someone else's top-level package), so its subpackages are listed
here under that name rather than found by ``find:``.
"""

from setuptools import Extension, find_packages, setup

BROKER_DIR, BROKER_PACKAGE = "broker", "equeue_broker"

broker_packages = [
    BROKER_PACKAGE + name[len(BROKER_DIR) :]
    for name in find_packages(include=[BROKER_DIR, f"{BROKER_DIR}.*"])
]

setup(
    package_dir={BROKER_PACKAGE: BROKER_DIR},
    packages=[
        *broker_packages,
        *find_packages(
            include=["equeue_spark", "equeue_spark.*", "equeue_proto", "equeue_proto.*"]
        ),
    ],
    ext_modules=[
        Extension(
            "equeue_proto._codec",
            ["equeue_proto/_codec.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # Without a compiler the pure-Python code paths are used (much slower).
            optional=True,
        )
    ],
)
