"""Where a job's coordinator listens for other hosts: on the addresses its
host name resolves to, which are the ones other hosts reach it by (the job's
CKPT_COORD_TCP names the host, not an address), and not on every interface.
A host name that resolves to loopback keeps the coordinator on loopback."""

import asyncio
import socket


def reachable_addresses(host):
    """The distinct IPv4 addresses `host` resolves to, in resolver order;
    every interface ("0.0.0.0") only if the name does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return ["0.0.0.0"]
    addresses = []
    for info in infos:
        address = info[4][0]
        if address not in addresses:
            addresses.append(address)
    return addresses or ["0.0.0.0"]


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
