"""A broker's gRPC server on an event loop thread of the test process, with a
real store and real clients over loopback: for tests that read the broker's
own state (counters, parked pulls, the in-sync set) while clients call it."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from equeue_broker.server.app import create_server
from equeue_broker.server.config import BrokerConfig
from equeue_broker.server.service_base import BrokerState
from equeue_broker.storage import Store

HOST = "127.0.0.1"


class InProcessBroker:
    """A broker's gRPC server on its own event loop thread, so the test can
    read its state (counters) directly while real clients call it."""

    def __init__(self, data_dir: Path, **settings: Any) -> None:
        values = {"data_dir": str(data_dir), "host": HOST, "port": 0, **settings}
        self.config = BrokerConfig.from_settings(values)
        self.store = Store(self.config.storage)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        started: Future[tuple[Any, int, BrokerState]] = asyncio.run_coroutine_threadsafe(
            create_server(self.config, self.store, None), self.loop
        )
        self.server, port, self.state = started.result(timeout=30)
        self.address = f"{HOST}:{port}"

    def close(self) -> None:
        async def stop() -> None:
            await self.state.health.stop()
            await self.state.checker.stop()
            self.state.calls.shutting_down = True
            self.state.insync.stop()
            await self.server.stop(0)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=30)
        self.state.calls.executor.shutdown(wait=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()
        self.store.close()
