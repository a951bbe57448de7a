"""Paths of source-tree files the end-to-end tests read (deploy/, clients/,
server/): in Bazel's runfiles under `bazel test`, else in this checkout."""
import os

_CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def path(relative):
    runfiles = os.environ.get("TEST_SRCDIR")
    if runfiles:
        candidate = os.path.join(runfiles, "tandem", relative)
        if os.path.exists(candidate):
            return candidate
    return os.path.join(_CHECKOUT, relative)


def free_port():
    return free_ports(1)[0]


def free_ports(n):
    """n distinct free ports: every socket stays bound until all are chosen."""
    import socket
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
