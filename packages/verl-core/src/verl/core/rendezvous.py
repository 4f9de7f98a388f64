"""Rendezvous stores for process groups: served on a port the OS picks in the serving process.

The worker groups' default process group and the weight channels between groups both meet through one.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch.distributed is imported where a store is made, not with this module
    from torch.distributed import TCPStore


def serve_store(host: str, world_size: int, timeout_s: float) -> TCPStore:
    """A TCPStore served from this process on ``host`` at a port the OS picks (no guessing by the caller,
    no window in which another process could take the port); ``store.port`` says which.

    The store listens on ``host`` only, not on every interface as TCPStore does when it opens its own
    socket."""
    from torch.distributed import TCPStore

    listener = _listening_socket(host)
    options = dict(
        host_name=host,
        port=listener.getsockname()[1],
        world_size=world_size,
        is_master=True,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
        master_listen_fd=listener.fileno(),
    )
    try:
        try:
            store = TCPStore(**options)
        except NotImplementedError:  # torch releases whose libuv store cannot serve a given socket
            store = TCPStore(**options, use_libuv=False)
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now, and closes it
    return store


def join_store(host: str, port: int, world_size: int, timeout_s: float) -> TCPStore:
    """A client of the store that :func:`serve_store` serves at ``host:port``."""
    from torch.distributed import TCPStore

    return TCPStore(host, port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s))


def _listening_socket(host: str) -> socket.socket:
    """A TCP socket listening on ``host`` at a port the OS picks."""
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.bind(address)
    sock.listen(1024)
    return sock
