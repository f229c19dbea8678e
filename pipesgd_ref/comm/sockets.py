"""Sockets for the rendezvous (comm/rendezvous.py): listeners and connections, over TCP or a
unix socket, and which host this is.

A connection is retried while the peer is not listening yet (ranks start in any order), until
the job's timeout; every error names the rank, the peer and what to do.
"""

from __future__ import annotations

import errno
import os
import socket
import time

from pipesgd_ref.errors import RendezvousError


def listen(host: str, port: int, what: str, rank: int) -> socket.socket:
    """A TCP listener on host:port (port 0: the OS picks a free one) for `what`; an error that
    says what to do when the port is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise RendezvousError(
                f"rank {rank}: cannot listen for the {what} on {host}:{port}: the port is in use "
                f"(another job, or an earlier one still running?). Choose another port "
                f"(--master-port or MASTER_PORT)"
            ) from None
        raise RendezvousError(f"rank {rank}: cannot listen on {host}:{port} ({e})") from None
    sock.listen(128)
    return sock


def connect(host: str, port: int, rank: int, timeout: float, peer: int, what: str):
    """Connect `rank` to `what` (rank `peer`) at host:port, retrying while the peer is not
    listening yet, until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, port), timeout=timeout)
        except (ConnectionRefusedError, TimeoutError, OSError) as e:
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"rank {rank}: could not reach {what} (rank {peer}) at {host}:{port} "
                    f"for {timeout:.1f} s ({e}); is it running, and is the address right?"
                ) from None
            time.sleep(0.05)


def listen_unix() -> socket.socket:
    """A unix listener at an address the kernel picks in the abstract namespace (Linux
    autobind): no file in the filesystem, gone with the process."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("")
    sock.listen(128)
    return sock


def connect_unix(name: str, rank: int, timeout: float, peer: int, what: str) -> socket.socket:
    """Connect to the abstract unix address `name` (as registered), retrying until timeout."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(b"\0" + name.encode())
            return sock
        except OSError as e:
            sock.close()
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"rank {rank}: could not reach {what} (rank {peer}) on its unix socket "
                    f"for {timeout:.1f} s ({e}); is it running on this host?"
                ) from None
            time.sleep(0.05)


def pid_namespace() -> str:
    """This process's PID namespace ("" where there is none to read): two ranks in different
    ones (containers sharing a host and a network) see different pids, so neither can tell
    from /proc whether the other still runs."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return ""


def node_id() -> str:
    """This host, as far as a unix socket reaches: the kernel's boot id and this process's
    network namespace (two namespaces on one machine are two hosts to a unix socket)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:  # not Linux: one host per hostname
        return socket.gethostname()
    return f"{socket.gethostname()}/{boot}/{netns}"
