"""Where a job's coordinator listens for other hosts: on the addresses its
host name resolves to, which are the ones other hosts reach it by (the job's
CKPT_COORD_TCP names the host, not an address), and not on every interface.
A host name that resolves to loopback only (Debian's 127.0.1.1 in
/etc/hosts, while other hosts resolve it through DNS) says nothing of how
other hosts reach it: then every interface, as before."""

import asyncio
import socket


def reachable_addresses(host):
    """The distinct IPv4 addresses `host` resolves to, in resolver order;
    every interface ("0.0.0.0") if the name does not resolve or resolves
    to loopback only."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return ["0.0.0.0"]
    addresses = []
    for info in infos:
        address = info[4][0]
        if address not in addresses:
            addresses.append(address)
    if all(address.startswith("127.") for address in addresses):
        return ["0.0.0.0"]
    return addresses


async def start_servers(on_connect, host, *, limit, backlog):
    """TCP servers on every address of `host`, all on one port (the first
    server's, chosen by the kernel): returns (servers, port)."""
    servers, port = [], 0
    try:
        for address in reachable_addresses(host):
            server = await asyncio.start_server(on_connect, host=address, port=port,
                                                limit=limit, backlog=backlog)
            servers.append(server)
            port = server.sockets[0].getsockname()[1]
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers, port
