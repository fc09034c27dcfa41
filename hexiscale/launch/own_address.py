"""Whether an address names this machine (``train``'s seed ``--master_addr`` when it starts the
plan's ranks here itself: they all run on this machine, so the store can only listen here).

"This machine" is tested by binding a socket to the address, which succeeds exactly for a local
interface (loopback or this host's own address); no interface list or hostname guess is needed.
"""

from __future__ import annotations

import socket

from planner.errors import SpecError


def own_address(addr: str, flag: str) -> str:
    """The IP of ``addr`` that this machine can listen on (IPv4 first); a ``SpecError`` naming
    ``flag`` when it does not resolve or is another machine's."""
    fix = f"drop {flag} (the ranks meet on 127.0.0.1), or start each node's ranks with 'hexiscale launch'"
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise SpecError(flag, f"{addr!r} does not resolve ({exc})", fix) from None
    ips = sorted({(info[0], str(info[4][0])) for info in infos}, key=lambda f: f[0] != socket.AF_INET)
    for family, ip in ips:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((ip, 0))
            except OSError:
                continue
        return ip
    raise SpecError(flag, f"{addr!r} is not this machine; 'train' without a launcher starts every rank here", fix)
