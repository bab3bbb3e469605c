"""A free TCP port on this machine, for the tests that start a process group (gloo) or a launcher."""

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
