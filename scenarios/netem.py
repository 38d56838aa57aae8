"""A traffic-shaping TCP proxy on loopback: real added latency and a real bandwidth cap.

No root, no kernel module: ``tc netem`` needs the sch_netem qdisc, which this project's build
machine lacks (``tc qdisc add dev lo root netem delay 1ms`` -> "Specified qdisc kind is
unknown"), and CAP_NET_ADMIN besides. Each direction is
a pipe: a chunk read from one side leaves the link ``len * 8 / bandwidth`` seconds after the
previous chunk finished serialising, and arrives ``rtt / 2`` later — so latency and bandwidth
compose as on a real link, and pipelined streams (HTTP/2, gRPC) keep several chunks in flight.
``set()`` changes both on the fly without dropping connections.
"""

from __future__ import annotations

import asyncio
import contextlib


class ShapingProxy:
    def __init__(self, target_host: str, target_port: int, rtt_ms: float = 0.0, bandwidth_bps: float = 10e9) -> None:
        self.target = (target_host, target_port)
        self.set(rtt_ms, bandwidth_bps)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self.port = 0

    def set(self, rtt_ms: float, bandwidth_bps: float) -> None:
        if rtt_ms < 0 or bandwidth_bps <= 0:
            raise ValueError("rtt_ms >= 0 and bandwidth_bps > 0 required")
        self.one_way_s = rtt_ms / 2e3
        self.bandwidth_bps = bandwidth_bps

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for src, dst in ((reader, up_w), (up_r, writer)):
            task = asyncio.create_task(self._pipe(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while (item := await q.get()) is not None:
                at, data = item
                delay = at - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(data)
                await writer.drain()

        out = asyncio.create_task(deliver())
        free_at = 0.0
        try:
            while data := await reader.read(1 << 16):
                start = max(loop.time(), free_at)
                free_at = start + len(data) * 8 / self.bandwidth_bps
                q.put_nowait((free_at + self.one_way_s, data))
            q.put_nowait(None)
            await out
        except (ConnectionError, asyncio.CancelledError):
            out.cancel()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
