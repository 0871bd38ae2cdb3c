"""The one loader of the C accelerator (``equeue_proto._codec``).

Every module that has a C fast path asks here, so ``EQUEUE_PURE_PYTHON=1`` (run
the pure-Python reference everywhere, as ``make test`` does for the codec,
wire and storage tests) and a build without a C compiler behave the same in
every layer. At import the extension's layout constants are asserted against
the Python specification of the formats: a mismatch is a build error, never
silently corrupt records.
"""

from __future__ import annotations

import os
from types import ModuleType

from equeue_proto.record import LAYOUT


def _load() -> ModuleType | None:
    if os.environ.get("EQUEUE_PURE_PYTHON"):
        return None
    try:
        from equeue_proto import _codec
    except ImportError:  # built without a C compiler
        return None
    check_layout(_codec.LAYOUT, LAYOUT)
    return _codec


def check_layout(native: dict[str, int], expected: dict[str, int]) -> None:
    """Raise ``ImportError`` naming every constant on which C and Python disagree."""
    wrong = {k: (native.get(k), v) for k, v in expected.items() if native.get(k) != v}
    if wrong:
        detail = ", ".join(f"{k}: C {c} != Python {p}" for k, (c, p) in sorted(wrong.items()))
        raise ImportError(f"equeue_proto._codec does not match the record format: {detail}")


CODEC: ModuleType | None = _load()
"""The C extension, or None when it is not built or ``EQUEUE_PURE_PYTHON`` is set."""
IMPLEMENTATION = "python" if CODEC is None else "c"
"""Which implementation the fast paths use: "c" or "python"."""
