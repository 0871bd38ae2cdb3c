"""gRPC services added as generic handlers only (the broker's and the name server's).

Depends on grpc alone, so the name server can use it without loading the
broker's storage (tests/project/test_layers.py).
"""

from __future__ import annotations

from typing import Any, cast

import grpc


class GenericOnly:
    """The server as the generated ``add_*Servicer_to_server`` functions see it:
    their services are added as generic handlers only, never as registered methods.

    gRPC's aio server keeps one pending "next call" future per registered method
    and waits on all of them (``asyncio.wait``) after every call it accepts: with
    the broker's 40-odd methods that was about a tenth of its CPU per produce or
    pull (issue 31). Generic handlers share one future; the method is looked up
    in a dict per service, the busiest service first."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        """Dropped: the same handlers came as a generic handler just before."""


def generic_only(server: grpc.aio.Server) -> grpc.aio.Server:
    """``server`` wrapped in ``GenericOnly``, typed as what the generated code takes."""
    return cast("grpc.aio.Server", GenericOnly(server))
