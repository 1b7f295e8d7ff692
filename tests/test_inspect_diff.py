"""inspect --diff's matching, on processes as inspect() describes them
(integration/test_inspect.py diffs a real job's checkpoints)."""
from ckpt.inspect import _diff_fds, _diff_memory, _diff_threads, signal_name, signal_set


def region(start, end, kind="anonymous", prot="rw-p", path="", saved=0):
    return {"start": start, "end": end, "kind": kind, "prot": prot, "path": path, "saved": saved,
            "stored": saved, "compressed": False, "pages_elsewhere": 0}


def test_regions_are_matched_by_start_then_by_end():
    old = {"memory": [region(0x1000, 0x3000, "heap"), region(0x10000, 0x12000, "stack"),
                      region(0x20000, 0x21000), region(0x30000, 0x31000, prot="r--p")]}
    new = {"memory": [region(0x1000, 0x5000, "heap"), region(0xF000, 0x12000, "stack"),
                      region(0x30000, 0x31000, prot="rw-p"), region(0x40000, 0x840000)]}
    found = _diff_memory(old, new)
    assert [(r["before"], r["after"], r["size_before"], r["size_after"]) for r in found["resized"]] == [
        ("000000001000-000000003000", "000000001000-000000005000", 0x2000, 0x4000),
        ("000000010000-000000012000", "00000000f000-000000012000", 0x2000, 0x3000)]
    assert [r["start"] for r in found["removed"]] == [0x20000]
    assert [r["start"] for r in found["added"]] == [0x40000]
    assert found["changed"] == [{"region": "000000030000-000000031000",
                                 "prot": ["r--p", "rw-p"]}]
    assert found["mapped_change"] == found["mapped_bytes"][1] - found["mapped_bytes"][0]


def test_threads_and_fds():
    a = {"threads": [{"tid": 1, "name": "a"}, {"tid": 2, "name": "b"}],
         "fds": [{"fd": 0, "kind": "file", "path": "/x", "flags": "O_RDONLY", "cloexec": False,
                  "offset": 0}, {"fd": 1, "kind": "pipe", "path": "", "flags": "O_WRONLY",
                                 "cloexec": False, "offset": 0}]}
    b = {"threads": [{"tid": 1, "name": "a"}, {"tid": 3, "name": "c"}],
         "fds": [{"fd": 0, "kind": "file", "path": "/x", "flags": "O_RDONLY", "cloexec": True,
                  "offset": 10}, {"fd": 2, "kind": "file", "path": "/y", "flags": "O_RDWR",
                                  "cloexec": False, "offset": 0}]}
    assert _diff_threads(a, b) == {"added": [{"tid": 3, "name": "c"}],
                                   "removed": [{"tid": 2, "name": "b"}]}
    fds = _diff_fds(a, b)
    assert [fd["fd"] for fd in fds["opened"]] == [2] and [fd["fd"] for fd in fds["closed"]] == [1]
    assert fds["changed"] == [{"fd": 0, "cloexec": [False, True], "offset": [0, 10]}]


def test_signal_names():
    assert [signal_name(n) for n in (1, 10, 32, 33, 34, 36, 64)] == [
        "SIGHUP", "SIGUSR1", "SIG32", "SIG33", "SIGRTMIN", "SIGRTMIN+2", "SIGRTMAX"]
    assert signal_set((1 << 9) | (1 << 11)) == ["SIGUSR1", "SIGUSR2"]
