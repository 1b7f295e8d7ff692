"""The schemas of `ckpt inspect --json` and `ckpt inspect --diff --json`
(docs/schemas/): valid JSON Schema, the diff's copies of the inspect
schema's definitions the same, their names those of the image header's
enums and of ckpt/inspect.py's tables, and a diff of two processes that
differ in every way valid (integration/test_inspect.py and
integration/test_multihost.py check real checkpoints' output)."""
import json
from pathlib import Path

import jsonschema
import pytest

from ckpt import inspect as inspection
from ckpt.headers import load_headers

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def schema(name):
    return json.loads((SCHEMAS / f"{name}.schema.json").read_text())


def validator(name):
    return jsonschema.Draft202012Validator(schema(name), format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("name", ["inspect", "inspect-diff"])
def test_schemas_are_valid(name):
    jsonschema.Draft202012Validator.check_schema(schema(name))


def test_diff_schema_shares_the_inspect_definitions():
    whole, diff = schema("inspect"), schema("inspect-diff")
    for name in ("count", "signal", "signals", "thread", "region", "socket", "fd"):
        assert diff["$defs"][name] == whole["$defs"][name], name


def test_names_are_the_decoders():
    defs = schema("inspect")["$defs"]
    headers = load_headers()
    assert set(defs["region"]["properties"]["kind"]["enum"]) == \
        set(inspection._enum_names(headers, "enum ckpt_vma_kind", "CKPT_VMA_").values())
    assert set(defs["fd"]["properties"]["kind"]["enum"]) == \
        set(inspection._enum_names(headers, "enum ckpt_fd_kind", "CKPT_FD_").values())
    process = defs["process"]["properties"]
    assert process["rlimits"]["propertyNames"]["enum"] == list(inspection.RLIMITS)
    handler = process["signals"]["properties"]["handlers"]["items"]["properties"]
    assert handler["flags"]["items"]["enum"] == [name for name, _ in inspection.SA_FLAGS]
    assert set(defs["queued_signal"]["properties"]["code"]["oneOf"][0]["enum"]) == \
        set(inspection.SI_CODES.values())
    assert defs["socket"]["properties"]["state"]["items"]["enum"] == \
        [word for _, word in inspection.SOCK_STATES]
    itimer = process["timers"]["properties"]["itimers"]["items"]["properties"]
    assert itimer["which"]["enum"] == list(inspection.ITIMERS)
    check = jsonschema.Draft202012Validator(defs["signal"])
    for number in range(1, 65):
        check.validate(inspection.signal_name(number))


def region(start, end, kind="anon", prot="rw-p", path="", saved=0):
    return {"start": start, "end": end, "kind": kind, "prot": prot, "path": path, "saved": saved,
            "stored": saved, "compressed": False, "pages_elsewhere": 0}


def fd(number, kind="file", path="/x", flags="O_RDONLY", **extra):
    return {"fd": number, "kind": kind, "path": path, "flags": flags, "cloexec": False,
            "offset": 0, "data": 0, **extra}


def process(pid, exe, threads, memory, fds):
    return {"pid": pid, "host": "node1", "image": f"{pid}.img", "size": 4096, "sources": [],
            "ppid": 1, "pgid": pid, "sid": pid, "cwd": "/", "exe": exe, "zombies": 0,
            "threads": [{"tid": t, "name": "t", "blocked_parked": ["SIGUSR2"], "pending": []}
                        for t in threads],
            "memory": memory, "fds": fds,
            "signals": {"pending": ["SIGRTMIN+2"], "handlers": [
                {"signal": "SIGTERM", "handler": "ignore", "flags": ["SA_RESTART"], "mask": []}],
                "queued": [{"tid": None, "signals": [
                    {"signal": "SIGUSR2", "code": "SI_USER", "sender_pid": pid,
                     "sender_uid": 0}]}]},
            "timers": {"itimers": [{"which": "real", "value_s": 1.5, "interval_s": 0}],
                       "posix": [{"id": 0, "clock": "monotonic", "notify": "signal",
                                  "signal": "SIGRTMIN+1", "tid": None, "value": 77,
                                  "left_s": 2.0, "interval_s": 0.0, "armed": True}]},
            "posix_timers": 1, "pending_signals": 1 << 35,
            "rlimits": {"nofile": {"soft": 1024, "hard": None}}, "other_records": {"sysv-sem": 1}}


def test_a_diff_that_changes_everything_is_valid(monkeypatch):
    socket = {"domain": 1, "type": 1, "state": ["connected"], "queued": 0, "peer": 7}
    a = {"v": 1, "checkpoint": 1, "path": "/c/j/ckpt-0001", "job_id": "j", "command": ["x"],
         "hosts": ["node1"], "parent": None, "processes": [
             process(10, "/bin/a", [10, 11], [region(0x1000, 0x3000, "heap"),
                                              region(0x10000, 0x12000, "stack"),
                                              region(0x20000, 0x21000),
                                              region(0x30000, 0x31000, prot="r--p")],
                     [fd(0), fd(1, "socket", "", "O_RDWR", socket=socket), fd(2)]),
             process(20, "/bin/gone", [20], [], [])]}
    b = {**a, "checkpoint": 2, "path": "/c/j/ckpt-0002", "parent": 1, "processes": [
        process(10, "/bin/b", [10, 12], [region(0x1000, 0x5000, "heap"),
                                         region(0xF000, 0x12000, "stack"),
                                         region(0x30000, 0x31000, prot="rw-p"),
                                         region(0x40000, 0x840000)],
                [fd(0, offset=10), fd(1, "socket", "", "O_RDWR",
                                      socket={**socket, "queued": 5}),
                 fd(3, dup_of=0)]),
        process(30, "/bin/new", [30], [], [])]}
    for document in (a, b):
        validator("inspect").validate(document)
    monkeypatch.setattr(inspection, "inspect", lambda path: {"a": a, "b": b}[path])
    found = inspection.diff("a", "b")
    validator("inspect-diff").validate(found)
    [changed] = found["changed"]
    assert changed["exe_before"] == "/bin/a" and changed["memory"]["resized"]
    assert {f["fd"] for f in changed["fds"]["changed"]} == {0, 1}
    assert [p["pid"] for p in found["appeared"]] == [30] and [p["pid"] for p in found["gone"]] == [20]


def test_the_schemas_refuse_what_the_format_does_not_have():
    with pytest.raises(jsonschema.ValidationError):
        validator("inspect").validate({"v": 2, "checkpoint": 1, "path": "/x", "job_id": "j",
                                       "command": [], "hosts": [], "parent": None,
                                       "processes": []})
    one = jsonschema.Draft202012Validator({"$defs": schema("inspect")["$defs"],
                                           "$ref": "#/$defs/process"})
    one.validate(process(10, "/bin/a", [10], [region(0x1000, 0x2000)], []))
    for bad in (process(10, "/bin/a", [10], [region(0x1000, 0x2000, prot="rwxq")], []),
                process(10, "/bin/a", [10], [region(0x1000, 0x2000, kind="anonymous")], []),
                process(10, "/bin/a", [], [], []),  # a process has a thread
                process(10, "/bin/a", [10], [], [fd(3, flags="O_WRONLY|append")])):
        with pytest.raises(jsonschema.ValidationError):
            one.validate(bad)
