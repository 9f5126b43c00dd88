"""The loopback provider's HTTP plumbing: HTTP/1.1 with keep-alive on asyncio in a thread of its
own (thousands of concurrent requests cost little), answers written as JSON, bytes, a file or a
stream that never ends, and a stop that leaves no socket behind."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Self

from .fake_batch_faults import Endless, Redirect


class LoopbackServer:
    """Serves `_route(method, target, body, writer, headers)` (the subclass's) on host:port; run
    with start() (a background thread) or serve_forever()."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._open: dict[asyncio.StreamWriter, asyncio.Task] = {}  # connections to drop on stop()
        self._stopping = False
        self._ready = threading.Event()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._stopping:  # accepted in the same turn as stop(): nothing to answer
            writer.transport.abort()
            return
        self._open[writer] = asyncio.current_task()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    k.strip().lower(): v.strip()
                    for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                keep_going = await self._route(method, path, body, writer, headers)
                if not keep_going or headers.get("connection", "").lower() == "close":
                    break
        except (
            asyncio.IncompleteReadError,
            ConnectionError,
            asyncio.LimitOverrunError,
            ValueError,
        ):
            pass
        except asyncio.CancelledError:
            pass  # stop() cancels open connections; a cancelled handler would be logged as an error
        finally:
            self._open.pop(writer, None)
            if not writer.is_closing():
                writer.close()

    @staticmethod
    def _send(writer: asyncio.StreamWriter, status: int, obj: Any, headers=()) -> bool:
        body = json.dumps(obj).encode()
        lines = [
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        return True

    @staticmethod
    def _send_bytes(
        writer: asyncio.StreamWriter,
        status: int,
        body: bytes,
        content_type: str = "application/jsonl",
    ) -> bool:
        head = (
            f"HTTP/1.1 {status} OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        return True

    @staticmethod
    async def _send_file(writer: asyncio.StreamWriter, status: int, path: Path) -> bool:
        """A file's content, streamed from disk a MiB at a time."""
        writer.write(
            (
                f"HTTP/1.1 {status} OK\r\nContent-Type: application/jsonl\r\n"
                f"Content-Length: {path.stat().st_size}\r\n\r\n"
            ).encode()
        )
        with path.open("rb") as handle:
            while chunk := handle.read(1024 * 1024):
                writer.write(chunk)
                await writer.drain()
        return True

    async def _send_batch_answer(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> bool:
        if isinstance(obj, Redirect):
            return self._send(writer, status, {}, [("Location", obj.location)])
        if isinstance(obj, Endless):
            return await self._send_endless(writer, obj)
        if isinstance(obj, bytes):
            return self._send_bytes(writer, status, obj)
        if isinstance(obj, Path):
            return await self._send_file(writer, status, obj)
        return self._send(writer, status, obj)

    async def _send_endless(self, writer: asyncio.StreamWriter, endless: Endless) -> bool:
        """A file's content, then its fill for as long as the client reads (64 KiB every 5 ms:
        what a loopback client reads past any bound in moments, on a machine others share)."""
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/jsonl\r\nConnection: close\r\n\r\n"
        )
        writer.write(endless.path.read_bytes())
        fill = Endless.FILL[endless.kind]
        while not self._stopping:
            writer.write(fill)
            await writer.drain()
            await asyncio.sleep(0.005)
        return False

    # Running -------------------------------------------------------------------------------
    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(_quiet_about_cancelled)
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, backlog=2048, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        async with self._server:
            await self._server.serve_forever()

    def start(self) -> Self:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._serve_quietly()), daemon=True, name="fake-provider"
        )
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake provider did not start")
        return self

    async def _serve_quietly(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve()
        # Wind down every connection before asyncio.run() closes the loop, so no socket outlives it:
        # handlers still answering are cancelled (they close their own socket), handlers accepted in
        # the turn of stop() start, see _stopping and drop theirs.
        me = asyncio.current_task()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for task in self._open.values():
                task.cancel()
            if not [t for t in asyncio.all_tasks() if t is not me]:
                break
            await asyncio.sleep(0.01)
        for _ in range(3):  # a closed transport lets go of its socket a turn later
            await asyncio.sleep(0)

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop and server:

            def shut_down() -> None:  # runs on the server's own loop, so the sets are its own
                self._stopping = True
                server.close()
                for writer in list(self._open):
                    # a handler still waiting is cancelled as the loop ends
                    writer.transport.abort()

            # Closing the server can end asyncio.run() (and close the loop) before this call:
            # then there is nothing left to stop.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(shut_down)
        if self._thread:
            self._thread.join(5)

    def serve_forever(self) -> None:
        asyncio.run(self._serve())


def _quiet_about_cancelled(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # Python 3.11's stream protocol asks a connection task cancelled before its first step for its
    # exception, which raises CancelledError into the loop's handler: that is a stop, not a fault.
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to the client."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
