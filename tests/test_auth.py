"""The coordinator's mutual HMAC handshake over a real socket pair (ckpt/auth.py)."""

import os
import socket
import threading

import pytest

from ckpt import auth


def run_pair(server_secret, client_secret):
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    result = {}

    def serve():
        try:
            auth.server_handshake(a.makefile("rwb"), server_secret)
            result["server"] = "ok"
        except auth.AuthError as err:
            result["server"] = err
    thread = threading.Thread(target=serve)
    thread.start()
    try:
        auth.client_handshake(b.makefile("rwb"), client_secret)
        result["client"] = "ok"
    except auth.AuthError as err:
        result["client"] = err
    thread.join()
    a.close()
    b.close()
    return result


def test_same_secret_both_sides_accept():
    secret = os.urandom(32)
    assert run_pair(secret, secret) == {"server": "ok", "client": "ok"}


def test_wrong_secret_refused_by_both():
    result = run_pair(os.urandom(32), os.urandom(32))
    assert isinstance(result["server"], auth.AuthError)
    assert isinstance(result["client"], auth.AuthError)


def test_garbage_instead_of_auth_is_refused():
    a, b = socket.socketpair()
    b.sendall(b"HELLO 1 2 3\n")
    with pytest.raises(auth.AuthError):
        auth.server_handshake(a.makefile("rwb"), os.urandom(32))
    a.close()
    b.close()


def test_secret_file_is_private_and_round_trips(tmp_path):
    path = tmp_path / "secret"
    secret = auth.create_secret_file(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert auth.load_secret(str(path)) == secret
    os.chmod(path, 0o644)
    with pytest.raises(auth.AuthError):
        auth.load_secret(str(path))
