"""The console's HTTP protocol: uvicorn's h11 protocol with a request-head timeout.

uvicorn times out a connection only between requests, once a response is complete; a
client that connects and sends nothing, or half a request head, holds its connection
(and a file descriptor) forever. Here a connection must deliver a complete request head
within HEAD_TIMEOUT_S of connecting or of its previous response, else it is closed.
The keep-alive timeout still closes an idle connection between requests (uvicorn's
`timeout_keep_alive`, IDLE_TIMEOUT_S here). docs/operations.md, "The run console".
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0  # to send a complete request head
IDLE_TIMEOUT_S = 5.0  # between requests on a kept-alive connection


class HeadTimeoutProtocol(H11Protocol):
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._arm_head()

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        super().data_received(data)
        if self.cycle is not before:  # a request head was read: its cycle began
            self._disarm_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_head()  # the next request's head, should one come

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head()
        super().connection_lost(exc)

    def _arm_head(self) -> None:
        self._disarm_head()
        self._head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timeout)

    def _disarm_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()
