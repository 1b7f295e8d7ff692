"""The agent's cffi-free reading of the headers' constants agrees with cffi's."""
from ckpt.headers import integer_constants, load_headers


def test_integer_constants_are_cffis():
    constants = integer_constants()
    headers = load_headers()
    assert {"CKPT_PROTOCOL_VERSION", "CKPT_LINE_MAX", "CKPT_IMAGE_VERSION"} <= constants.keys()
    for name, value in constants.items():
        assert headers.const(name) == value, name
