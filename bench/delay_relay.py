"""A TCP relay that behaves like a network between a worker and its store:
every byte arrives a fixed one-way delay after it was sent, and each
direction is capped at a bandwidth shared by every connection (a link, not
a per-connection limit), and each connection has at most a window of bytes
waiting for the link (`--window-kb`), as a TCP flow through a router has
its congestion window, not the whole response, queued there. In userspace because this kernel has no
`sch_netem`; the relay's own cost (a Python event loop) is on the same
cores as everything else, which a real network's is not.

    python bench/delay_relay.py --listen 127.0.0.1:0 --to 127.0.0.1:9000 \\
        --rtt-ms 10 --mbit 1000 --window-kb 64

Prints `listening HOST:PORT` once bound; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket


class Link:
    """One direction's bandwidth: when the link is next free to send."""

    def __init__(self, bytes_per_s: float):
        self.rate = bytes_per_s
        self.free_at = 0.0

    def send(self, now: float, n: int) -> float:
        """When `n` bytes offered at `now` have left the link."""
        if self.rate <= 0:
            return now
        start = max(now, self.free_at)
        self.free_at = start + n / self.rate
        return self.free_at


def ack_at_once(sock: socket.socket | None) -> None:
    """Acknowledges what `sock` received now, not after Linux's 40 ms
    delayed-ACK timer. The stores this relay fronts (s3s-fs) do not set
    TCP_NODELAY, so a response body's last small segment waits for the ACK
    of the ones before it: 40 ms on every GET that a store on another
    machine (which sets it, as S3 does) would not take. Not sticky in the
    kernel, so set again after every read."""
    if sock is not None and hasattr(socket, "TCP_QUICKACK"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, link: Link, window: int,
               from_sock: socket.socket | None = None) -> None:
    """Copies `reader` to `writer`, each read arriving `delay` after it left
    the link; `from_sock`, `reader`'s socket, acknowledges each read at once.

    At most `window` bytes of this connection wait for the link (0: no
    bound): a read that would queue more waits until the link has sent
    enough of what is queued. Unbounded, the relay read every response as
    fast as the store wrote it and queued it all, so a request made while
    a few hundred MB were on their way waited behind all of them (seconds),
    where a real link shares itself among the flows and a new one waits
    for the bytes queued at the bottleneck, a window per flow."""
    loop = asyncio.get_running_loop()
    queue: collections.deque = collections.deque()
    arrived = asyncio.Event()
    done = False

    async def deliver() -> None:
        while True:
            while not queue:
                if done:
                    return
                arrived.clear()
                await arrived.wait()
            due, data = queue.popleft()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    task = asyncio.create_task(deliver())
    try:
        # Until the far end goes (`deliver` fails): what is still coming
        # for a client that is gone (a killed job's responses) is not read,
        # so it does not take the link from the runs after it.
        while not task.done() and (data := await reader.read(min(256 << 10, window) if window else 256 << 10)):
            ack_at_once(from_sock)
            sent = link.send(loop.time(), len(data))
            queue.append((sent + delay, data))
            arrived.set()
            if window and link.rate > 0:
                # Until no more than `window` bytes of this flow are left
                # for the link to send.
                wait = sent - window / link.rate - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
    except ConnectionError:
        pass
    finally:
        done = True
        arrived.set()
        try:
            await task
            writer.write_eof()
        except (ConnectionError, OSError, RuntimeError):
            pass


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:0")
    ap.add_argument("--to", required=True, help="HOST:PORT of the store")
    ap.add_argument("--rtt-ms", type=float, default=10.0, help="round-trip time added (half each way)")
    ap.add_argument("--mbit", type=float, default=1000.0, help="bandwidth each way, Mbit/s (0: none)")
    ap.add_argument("--window-kb", type=int, default=64,
                    help="bytes of one connection that may wait for the link, KB (0: no bound: whole responses queue)")
    args = ap.parse_args()
    host, port = args.to.rsplit(":", 1)
    delay = args.rtt_ms / 2000.0
    up, down = Link(args.mbit * 125_000), Link(args.mbit * 125_000)
    window = args.window_kb << 10

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            store_r, store_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, store_w, delay, up, window),
                             pipe(store_r, client_w, delay, down, window, store_w.get_extra_info("socket")))
        for w in (client_w, store_w):
            w.close()

    lhost, lport = args.listen.rsplit(":", 1)
    server = await asyncio.start_server(serve, lhost, int(lport))
    addr = server.sockets[0].getsockname()
    print(f"listening {addr[0]}:{addr[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
