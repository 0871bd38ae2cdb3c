"""Only the C extension lives here; all other metadata is declarative in setup.cfg."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "broker.storage._codec",
            ["broker/storage/_codec.c"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # Without a compiler the pure-Python encoder is used (much slower).
            optional=True,
        )
    ]
)
