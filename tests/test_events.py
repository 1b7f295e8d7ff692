"""The event log's writing and reading, the status's one-line command and
the progress's byte count per host: the parts that do not need a job
(integration/test_status.py has them on real jobs)."""
import json
import os
from pathlib import Path

import jsonschema
import pytest

from ckpt import events
from ckpt.job_status import command_line
from ckpt.progress import bytes_by_host

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "docs" / "schemas" /
                     "events.schema.json").read_text())


def test_lines_are_appended_and_read_back(tmp_path):
    said = []
    for number in (1, 2):
        events.record(tmp_path, "host_lost", {"job_id": "j", "host": f"h{number}",
                                              "processes": number}, said.append)
    logged = events.read(tmp_path)
    assert [e["host"] for e in logged] == ["h1", "h2"] and said == []
    for event in logged:
        jsonschema.validate(event, SCHEMA)
    assert events.last(tmp_path, ("host_lost",))["host"] == "h2"
    assert events.last(tmp_path, ("checkpoint",)) is None


def test_a_line_cut_short_or_of_another_version_is_skipped(tmp_path):
    events.record(tmp_path, "host_lost", {"job_id": "j", "host": "h1", "processes": 1}, print)
    with open(events.events_path(tmp_path), "a") as log:
        log.write('{"v": 2, "kind": "checkpoint"}\n{"v": 1, "kind": "chec')
    assert [e["host"] for e in events.read(tmp_path)] == ["h1"]


@pytest.mark.skipif(os.getuid() == 0, reason="root writes a read-only directory")
def test_an_unwritable_log_warns_once_and_goes_on(tmp_path):
    tmp_path.chmod(0o500)
    said = []
    try:
        for _ in range(3):
            event = events.record(tmp_path, "host_lost", {"job_id": "j", "host": "h",
                                                          "processes": 1}, said.append)
            assert event["kind"] == "host_lost"
    finally:
        tmp_path.chmod(0o700)
    assert len(said) == 1 and "cannot write the event log" in said[0]


def test_a_log_in_a_missing_directory_warns_once(tmp_path):
    said = []
    for _ in range(2):
        events.record(tmp_path / "gone", "host_lost", {"job_id": "j", "host": "h",
                                                       "processes": 1}, said.append)
    assert len(said) == 1 and str(tmp_path / "gone" / "events.jsonl") in said[0]


def test_checkpoint_fields_from_a_manifest(tmp_path):
    manifest = {"job_id": "j", "checkpoint": 3, "start_ns": 10**18, "end_ns": 10**18 + 2 * 10**9,
                "parent": 2, "stage_dir": None, "warnings": ["w"], "processes": [
                    {"pid": 5, "host": "a", "size": 100, "write_ns": 10**9, "stopped_ns": 5 * 10**6},
                    {"pid": 6, "host": "b", "size": 50, "write_ns": 2 * 10**9, "stopped_ns": 9 * 10**6,
                     "flush_ns": 3 * 10**9}]}
    event = events.checkpoint_taken(tmp_path, manifest, tmp_path / "ckpt-0003", {"WRITE": 1.5},
                                    print)
    jsonschema.validate(event, SCHEMA)
    assert event["duration_s"] == 2 and event["bytes"] == 150 and event["incremental"]
    assert event["stopped_max_s"] == 0.009 and event["stopped_max_process"] == {"host": "b", "pid": 6}
    assert event["hosts"]["b"] == {"processes": 1, "bytes": 50, "write_s": 2, "stopped_s": 0.009,
                                   "flush_s": 3}
    assert events.read(tmp_path) == [event]


def test_commands_are_one_shell_quoted_line():
    assert command_line(["sh", "-c", "a\nb"]) == "sh -c 'a\\nb'"
    assert command_line(["./sim", "in put"]) == "./sim 'in put'"
    assert command_line([]) == "-"


def test_bytes_by_host_counts_each_hosts_images(tmp_path):
    for name, size in (("node1-12.img", 10), ("node1-12.img.sum", 1), ("node1-ib-7.img", 20),
                       ("manifest.yaml", 99)):
        (tmp_path / name).write_bytes(b"x" * size)
    assert bytes_by_host(tmp_path, ["node1", "node1-ib"]) == {"node1": 11, "node1-ib": 20}
    assert bytes_by_host(tmp_path / "gone", ["node1"]) == {"node1": 0}


def _checkpoint_event(number, kind="checkpoint"):
    return {"v": 1, "time": events.iso_time(1.8e9 + number), "kind": kind, "job_id": "big",
            "checkpoint": number, "path": f"/ckpt/big/ckpt-{number:04d}", "bytes": number * 4096,
            "warnings": ["w" * (number % 300)]}  # lines of many lengths, across blocks


def test_malformed_lines_are_skipped_counted_and_warned_of_once(tmp_path):
    good = [_checkpoint_event(n) for n in (1, 2, 3)]
    lines = [json.dumps(good[0]), "not json", json.dumps([1, 2]), json.dumps({"v": 1}),
             json.dumps(good[1]), json.dumps({"v": 7, "kind": "checkpoint"}), "",
             json.dumps(good[2]), '{"v": 1, "kind": "chec']
    events.events_path(tmp_path).write_text("\n".join(lines))
    said = []
    log = events.read(tmp_path, said.append)
    assert list(log) == good
    assert (log.malformed, log.other_versions, log.lines) == (4, 1, 8)
    assert said == [f"{events.events_path(tmp_path)}: skipped 4 malformed lines"]
    # the newest of a kind, read from the end past the cut-short line
    assert events.last(tmp_path, ("checkpoint",)) == good[2]
    assert events.read(tmp_path / "none") == [] and events.last(tmp_path / "none", ("x",)) is None


def test_a_log_of_ten_thousand_checkpoints_is_read_from_its_end(tmp_path):
    """last() reads backwards a block at a time: the answers it gives on a
    big log are the ones reading it whole gives (correctness only)."""
    written = []
    with open(events.events_path(tmp_path), "w") as log:
        for number in range(1, 10_001):
            event = _checkpoint_event(number)
            if number % 1000 == 0:
                event = _checkpoint_event(number, "checkpoint_failed")
            written.append(event)
            log.write(json.dumps(event, separators=(",", ":")) + "\n")
        failed_early = _checkpoint_event(0, "restart_failed")
        log.write("garbage line\n")
    whole = events.read(tmp_path)
    assert list(whole) == written and whole.malformed == 1
    assert events.last(tmp_path, ("checkpoint",)) == written[-2]  # 10000 failed
    assert events.last(tmp_path, ("checkpoint_failed",)) == written[-1]
    assert events.last(tmp_path, ("restart",)) is None
    # a line longer than a block, and blocks small enough to cut every line
    lines = list(events.lines_backwards(events.events_path(tmp_path), block=97))
    assert lines[0] == "" and lines[1] == "garbage line"
    assert [json.loads(line) for line in lines[2:]] == written[::-1]
    with open(events.events_path(tmp_path), "a") as log:
        log.write(json.dumps(failed_early) + "\n")
    assert events.last(tmp_path, ("restart_failed", "checkpoint")) == failed_early


def test_a_checkpoints_progress_as_a_log_line(tmp_path):
    from ckpt.progress import checkpoint_line
    for name, size in (("n1-5.img", 3 * 1024), ("n1-5.img.sum", 1024), ("n2-9.img", 2048)):
        (tmp_path / name).write_bytes(b"x" * size)
    done = bytes_by_host(tmp_path, ["n1", "n2"])
    progress = {"number": 7, "phase": "WRITE", "staged": False}
    assert checkpoint_line(progress, done, {"n1": 4096, "n2": 4096}) == \
        "ckpt-0007 writing images: 6.0 KiB of ~8.0 KiB (n1 4.0 KiB, n2 2.0 KiB)"
    # the first checkpoint has no estimate; more than estimated: the bytes themselves
    assert checkpoint_line({**progress, "phase": "SYNC", "staged": True}, {"n1": 10}, {}) == \
        "ckpt-0007 copying staged images (job running): 10 B"
    assert checkpoint_line(progress, {"n1": 5000}, {"n1": 10}) == \
        "ckpt-0007 writing images: 4.9 KiB of ~4.9 KiB"
