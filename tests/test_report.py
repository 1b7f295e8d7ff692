"""`ckpt report` on event logs written here: the refusals (one line, a
non-zero exit) and what the page's tables hold.  integration/test_report_page.py
builds one from a real job and opens it in a browser."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt import events, report

REPO = Path(__file__).resolve().parent.parent


def ckpt(*args, cwd):
    return subprocess.run([sys.executable, "-m", "ckpt", *map(str, args)], cwd=cwd,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                               "XDG_RUNTIME_DIR": str(cwd), "CKPT_CONFIG": str(cwd / "none")},
                          capture_output=True, text=True, timeout=120)


def checkpoint_event(number, **more):
    return {"v": 1, "time": events.iso_time(1.8e9 + 60 * number), "kind": "checkpoint",
            "job_id": "rep", "checkpoint": number, "path": f"/nowhere/ckpt-{number:04d}",
            "start": events.iso_time(1.8e9 + 60 * number - 2), "duration_s": 1.5 + number,
            "bytes": 1000 * number, "processes": 2, "incremental": number > 1, "kill": False,
            "staged": True, "stopped_max_s": 0.25, "stopped_max_process": {"host": "b", "pid": 7},
            "phases": {"SUSPEND": 0.125, "WRITE": 1.0, "PUBLISH": 0.5},
            "hosts": {"a": {"processes": 1, "bytes": 400 * number, "write_s": 0.5,
                            "stopped_s": 0.125, "flush_s": 2.0},
                      "b": {"processes": 1, "bytes": 600 * number, "write_s": 0.75,
                            "stopped_s": 0.25, "flush_s": 3.0}},
            "warnings": [f"warned {number}"] if number == 2 else [], **more}


def write_log(job_dir, lines):
    job_dir.mkdir(exist_ok=True)
    events.events_path(job_dir).write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("case, expected", [
    ("missing", "no such job directory"),
    ("no log", "no event log (events.jsonl)"),
    ("empty", "no events yet"),
    ("malformed", "malformed event log (none of its 2 lines is an event of format 1)"),
    ("no such checkpoint", "no checkpoint 9 in the event log (it has 1)"),
    ("unwritable", "cannot write"),
])
def test_refusals_are_one_line_and_fail(tmp_path, case, expected):
    job_dir = tmp_path / "job"
    args = []
    if case != "missing":
        job_dir.mkdir()
    if case == "empty":
        write_log(job_dir, [])
    elif case == "malformed":
        write_log(job_dir, ["{not json", json.dumps({"kind": "checkpoint"})])
    elif case == "no such checkpoint":
        write_log(job_dir, [json.dumps(checkpoint_event(1))])
        args = ["--checkpoint", "9"]
    elif case == "unwritable":
        write_log(job_dir, [json.dumps(checkpoint_event(1))])
    output = tmp_path / ("gone/r.html" if case == "unwritable" else "r.html")
    done = ckpt("report", job_dir, "-o", output, *args, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == "", done
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "r.html").exists()


def test_the_page_holds_the_log(tmp_path):
    job_dir = tmp_path / "job"
    restart = {"v": 1, "time": events.iso_time(1.8e9 + 150), "kind": "restart", "job_id": "rep",
               "checkpoint": 2, "path": "/nowhere/ckpt-0002", "start": events.iso_time(1.8e9 + 140),
               "duration_s": 4.25, "bytes": 2000, "processes": 2, "hosts": {"a": "c", "b": "b"}}
    lost = {"v": 1, "time": events.iso_time(1.8e9 + 170), "kind": "host_lost", "job_id": "rep",
            "host": "c", "processes": 1}
    write_log(job_dir, [json.dumps(checkpoint_event(1)), "garbage",
                        json.dumps(checkpoint_event(2)), json.dumps(restart),
                        json.dumps(checkpoint_event(3)), json.dumps(lost)])
    done = ckpt("report", job_dir, "-o", tmp_path / "r.html", "--checkpoint", "2", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == f"{tmp_path / 'r.html'}\n", done.stderr
    assert done.stderr == f"ckpt: warning: {job_dir}/events.jsonl: skipped 1 malformed line\n"
    page = (tmp_path / "r.html").read_text()
    assert "<script src" not in page and "Plotly.newPlot" in page
    assert "Where the time of ckpt-0002 went" in page
    assert ("<tr><td>b</td><td>1</td><td>1200</td><td>0.250000</td><td>0.750000</td>"
            "<td>3.000000</td></tr>") in page  # host b of checkpoint 2
    assert "<td>restart from ckpt-0002</td>" not in page  # restarts have their own table
    assert "<td>a→c, b</td><td>ok</td>" in page
    assert "<td>host_lost</td><td>host c lost</td><td>1 processes there</td>" in page
    assert "<td>ckpt-0002</td><td>warned 2</td>" in page
    assert "3 checkpoints, 1 restarts, 1 failures, 1 warnings" in page
    assert "Skipped: 1 malformed lines" in page
    # the manifest is gone: no per-process chart, and the page says so
    assert 'id="no-processes"' in page and 'id="plot-processes"' not in page
    plots = json.loads(page.split("const PLOTS = ", 1)[1].split(";\n", 1)[0].replace("<\\/", "</"))
    by_id = {plot["id"]: plot["figure"] for plot in plots}
    assert list(by_id) == ["plot-phases", "plot-hosts", "plot-sizes", "plot-times",
                           "plot-bandwidth"]
    sizes = by_id["plot-sizes"]["data"]
    assert [(t["name"], t["x"], t["y"]) for t in sizes] == [
        ("full", ["ckpt-0001"], [1000]), ("incremental", ["ckpt-0002", "ckpt-0003"], [2000, 3000])]
    bandwidth = {t["name"]: t["y"] for t in by_id["plot-bandwidth"]["data"]}
    assert bandwidth["b flush"] == [600 * n / 3.0 / 2**20 for n in (1, 2, 3)]
