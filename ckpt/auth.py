"""Per-job secret and the mutual challenge-response that opens every coordinator
connection (docs/PROTOCOL.md, "Authentication"). The secret never crosses the wire:
each side proves it with HMAC-SHA256 over both nonces, labelled by direction so a
proof cannot be reflected back."""

import hashlib
import hmac
import os
import secrets
import stat

SECRET_BYTES = 32
NONCE_BYTES = 16
HANDSHAKE_TIMEOUT = 10.0  # a peer that says nothing is not kept waiting on


class AuthError(Exception):
    """The peer did not prove it knows the job's secret (or broke the handshake)."""


def create_secret_file(path):
    """Write 32 random bytes to a new 0600 file; refuses to reuse an existing one."""
    secret = secrets.token_bytes(SECRET_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


def load_secret(path):
    """Read the secret; a file others can read or of the wrong size is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise AuthError("secret file %s is readable by others" % path)
        secret = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(secret) != SECRET_BYTES:
        raise AuthError("secret file %s does not hold %d bytes" % (path, SECRET_BYTES))
    return secret


def proof(secret, label, first_nonce, second_nonce):
    return hmac.new(secret, label + b" " + first_nonce + b" " + second_nonce,
                    hashlib.sha256).hexdigest()


def _words(line, expected):
    words = line.decode("ascii", "replace").split()
    if len(words) != len(expected) or words[0] != expected[0]:
        raise AuthError("unexpected handshake line %r" % line[:64])
    return words[1:]


def _read_words(stream, expected):
    return _words(stream.readline(256), expected)


def _challenge():
    nonce = secrets.token_hex(NONCE_BYTES).encode()
    return nonce, b"CHALLENGE " + nonce + b"\n"


def _check_client(secret, server_nonce, auth_line):
    """The reply to the client's AUTH line: AUTH-OK with our own proof.
    A wrong proof raises AuthError (the caller sends AUTH-FAIL)."""
    client_nonce, client_proof = _words(auth_line, ["AUTH", "", ""])
    expected = proof(secret, b"client", server_nonce, client_nonce.encode())
    if not hmac.compare_digest(expected, client_proof):
        raise AuthError("wrong proof of the job's secret")
    return b"AUTH-OK " + proof(secret, b"server", client_nonce.encode(), server_nonce).encode() + b"\n"


def _answer_challenge(secret, challenge_line):
    """(client nonce, server nonce, our AUTH line) for a CHALLENGE line."""
    (server_nonce,) = _words(challenge_line, ["CHALLENGE", ""])
    client_nonce = secrets.token_hex(NONCE_BYTES)
    line = "AUTH %s %s\n" % (client_nonce, proof(secret, b"client", server_nonce.encode(),
                                                 client_nonce.encode()))
    return client_nonce, server_nonce, line.encode()


def _check_server(secret, client_nonce, server_nonce, ok_line):
    if ok_line.startswith(b"AUTH-FAIL"):
        raise AuthError("the coordinator refused our proof of the job's secret (wrong secret file?)")
    (server_proof,) = _words(ok_line, ["AUTH-OK", ""])
    expected = proof(secret, b"server", client_nonce.encode(), server_nonce.encode())
    if not hmac.compare_digest(expected, server_proof):
        raise AuthError("the coordinator does not know the job's secret")


def server_handshake(stream, secret):
    """Coordinator side: CHALLENGE, check the client's AUTH, answer AUTH-OK."""
    server_nonce, challenge = _challenge()
    stream.write(challenge)
    stream.flush()
    try:
        reply = _check_client(secret, server_nonce, stream.readline(256))
    except AuthError:
        stream.write(b"AUTH-FAIL\n")
        stream.flush()
        raise
    stream.write(reply)
    stream.flush()


def client_handshake(stream, secret):
    """Client side: answer the CHALLENGE, then check the coordinator's own proof."""
    client_nonce, server_nonce, line = _answer_challenge(secret, stream.readline(256))
    stream.write(line)
    stream.flush()
    _check_server(secret, client_nonce, server_nonce, stream.readline(256))


async def _readline(reader, timeout):
    # imported here: the command line's synchronous handshake should not
    # pay for loading asyncio (20 ms of every `ckpt` command's start-up)
    import asyncio

    line = await asyncio.wait_for(reader.readline(), timeout)
    if len(line) > 256:
        raise AuthError("handshake line too long")
    return line


async def server_handshake_async(reader, writer, secret, timeout=HANDSHAKE_TIMEOUT):
    """server_handshake on asyncio streams; AuthError also on a timeout."""
    server_nonce, challenge = _challenge()
    writer.write(challenge)
    await writer.drain()
    try:
        reply = _check_client(secret, server_nonce, await _readline(reader, timeout))
    except TimeoutError:    # asyncio's, since Python 3.11
        raise AuthError("no answer to the challenge within %g s" % timeout)
    except AuthError:
        writer.write(b"AUTH-FAIL\n")
        await writer.drain()
        raise
    writer.write(reply)
    await writer.drain()


async def client_handshake_async(reader, writer, secret, timeout=HANDSHAKE_TIMEOUT):
    """client_handshake on asyncio streams."""
    try:
        client_nonce, server_nonce, line = _answer_challenge(secret, await _readline(reader, timeout))
        writer.write(line)
        await writer.drain()
        _check_server(secret, client_nonce, server_nonce, await _readline(reader, timeout))
    except TimeoutError:    # asyncio's, since Python 3.11
        raise AuthError("the coordinator did not finish the handshake within %g s" % timeout)
