"""A TCP proxy that adds a fixed one-way delay in each direction (the virtual board's shaped link:
this kernel has no ``tc netem``). Run as its own process by :mod:`tasks.vboard.link`::

    python -m tasks.vboard.delay_proxy --listen 10.231.7.1 --to 10.231.7.2:22 --delay-ms 50 --ready F

Each direction of each connection is a reader that stamps every chunk it receives with
``arrival + delay`` into a queue, and a writer that sends each chunk when its time comes. Chunks
in flight overlap, so the delay does not cost throughput (up to ``QUEUE_CHUNKS`` chunks in flight
per direction; then the reader waits, which pushes back on the sender through TCP). The upstream
socket notices a dead link like the host's transport does (TCP_USER_TIMEOUT + keepalive) and then
closes the client side too, so a cut link still ends the client's session. Standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys

CHUNK = 64 * 1024
QUEUE_CHUNKS = 256
USER_TIMEOUT_MS = 10_000


def _tune(sock: socket.socket | None) -> None:
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 3)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk sent ``delay`` seconds after it arrived."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

    async def stamp() -> None:
        with contextlib.suppress(OSError):  # a reset or a dead link ends the stream like an EOF
            while data := await reader.read(CHUNK):
                await queue.put((loop.time() + delay, data))
        await queue.put((loop.time() + delay, b""))

    feeder = asyncio.create_task(stamp())
    try:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    finally:
        feeder.cancel()


async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, target: tuple[str, int],
                delay: float) -> None:  # fmt: skip
    """One client connection: connect upstream, then pipe both ways until either side ends."""
    _tune(client_w.get_extra_info("socket"))
    try:
        up_r, up_w = await asyncio.wait_for(asyncio.open_connection(*target), timeout=10)
    except (TimeoutError, OSError):
        client_w.close()
        return
    _tune(up_w.get_extra_info("socket"))
    tasks = [
        asyncio.create_task(pipe(client_r, up_w, delay)),
        asyncio.create_task(pipe(up_r, client_w, delay)),
    ]
    try:  # both directions until each has ended; a write error in either ends both
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a peer that went away is no error of the proxy
    finally:
        for task in tasks:
            task.cancel()
        for w in (client_w, up_w):
            w.close()


async def main_async(listen: str, target: tuple[str, int], delay: float, ready: str) -> None:
    server = await asyncio.start_server(
        lambda r, w: serve(r, w, target, delay), listen, 0, reuse_address=True
    )
    port = server.sockets[0].getsockname()[1]
    tmp = f"{ready}.tmp"
    with open(tmp, "w") as fh:
        fh.write(f"{port}\n")
    os.replace(tmp, ready)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the proxy until SIGTERM."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="address to listen on (the port is chosen)")
    ap.add_argument("--to", required=True, metavar="HOST:PORT", help="where to forward (the board's sshd)")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to each direction")
    ap.add_argument("--ready", required=True, help="file the chosen port is written to once listening")
    args = ap.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    asyncio.run(main_async(args.listen, (host, int(port)), args.delay_ms / 1000.0, args.ready))
    return 0


if __name__ == "__main__":
    sys.exit(main())
