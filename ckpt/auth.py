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


def _read_words(stream, expected):
    line = stream.readline(256)
    words = line.decode("ascii", "replace").split()
    if len(words) != len(expected) or words[0] != expected[0]:
        raise AuthError("unexpected handshake line %r" % line[:64])
    return words[1:]


def server_handshake(stream, secret):
    """Coordinator side: CHALLENGE, check the client's AUTH, answer AUTH-OK."""
    server_nonce = secrets.token_hex(NONCE_BYTES).encode()
    stream.write(b"CHALLENGE " + server_nonce + b"\n")
    stream.flush()
    client_nonce, client_proof = _read_words(stream, ["AUTH", "", ""])
    expected = proof(secret, b"client", server_nonce, client_nonce.encode())
    if not hmac.compare_digest(expected, client_proof):
        stream.write(b"AUTH-FAIL\n")
        stream.flush()
        raise AuthError("wrong proof of the job's secret")
    stream.write(b"AUTH-OK " + proof(secret, b"server", client_nonce.encode(),
                                     server_nonce).encode() + b"\n")
    stream.flush()


def client_handshake(stream, secret):
    """Client side: answer the CHALLENGE, then check the coordinator's own proof."""
    (server_nonce,) = _read_words(stream, ["CHALLENGE", ""])
    client_nonce = secrets.token_hex(NONCE_BYTES)
    stream.write(("AUTH %s %s\n" % (client_nonce, proof(
        secret, b"client", server_nonce.encode(), client_nonce.encode()))).encode())
    stream.flush()
    (server_proof,) = _read_words(stream, ["AUTH-OK", ""])
    expected = proof(secret, b"server", client_nonce.encode(), server_nonce.encode())
    if not hmac.compare_digest(expected, server_proof):
        raise AuthError("the coordinator does not know the job's secret")
