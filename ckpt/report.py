"""`ckpt report`: one self-contained HTML page built from a job's event log
(docs/EVENTS.md): where the time of a checkpoint went across hosts and
processes, how sizes, durations and stopped times evolved over the job's
checkpoints and restarts, and every failure and warning.

The charts are plotly's; plotly.js is inlined once in the page, so the
page opens with no network (docs/REPORT.md)."""

import datetime
import html
import json
from pathlib import Path

from ckpt import events
from ckpt.errors import CkptError
from ckpt.job_status import human_size
from ckpt.manifest import read_manifest
from ckpt.paths import checkpoint_name

REPORT_VERSION = 1
# a phase's colour, the same in every chart
COLOURS = {"stopped": "#d62728", "write": "#1f77b4", "flush": "#2ca02c", "full": "#1f77b4",
           "incremental": "#aec7e8", "duration": "#ff7f0e", "restart": "#9467bd"}
FAILURES = ("checkpoint_failed", "restart_failed", "host_lost")


def job_directory(job):
    """A job directory given as itself, a running job's id, or a job id
    under the configured --ckpt-dir."""
    path = Path(job)
    if path.is_dir():
        return path
    if "/" not in job and job not in (".", ".."):
        from ckpt.config import load_config
        from ckpt.jobs import list_jobs
        for running in list_jobs():
            if running.job_id == job:
                return Path(running.job_dir)
        under = load_config().ckpt_dir / job
        if under.is_dir():
            return under
    raise CkptError(f"{job}: no such job directory (nor a running job or one in the ckpt dir)")


def load(job_dir, warn):
    """The log's events (a non-empty events.Log); CkptError in one line for
    a missing, empty or wholly malformed log.  Malformed lines among good
    ones are skipped, and warn() is told how many."""
    path = events.events_path(job_dir)
    try:
        log = events.read_log(job_dir)
    except FileNotFoundError:
        raise CkptError(f"{job_dir}: no event log ({events.EVENTS_NAME}): not a job directory, "
                        "or a job from before event logs") from None
    except IsADirectoryError:
        raise CkptError(f"{path}: is a directory, not an event log") from None
    if log.lines == 0:
        raise CkptError(f"{path}: no events yet (the job took no checkpoint)")
    if not log:
        why = f"none of its {log.lines} lines is an event of format {events.EVENTS_VERSION}"
        raise CkptError(f"{path}: malformed event log ({why})")
    if log.malformed:
        warn(f"{path}: skipped {log.malformed} malformed line{'s' if log.malformed != 1 else ''}")
    return log


def _label(event):
    number = event.get("checkpoint")
    name = checkpoint_name(number) if isinstance(number, int) else "?"
    return {"checkpoint": name, "checkpoint_failed": f"{name} failed",
            "restart": f"restart from {name}", "restart_failed": f"restart from {name} failed",
            "host_lost": f"host {event.get('host')} lost"}.get(event["kind"], event["kind"])


def _chosen(log, number):
    checkpoints = [e for e in log if e["kind"] == "checkpoint"]
    if number is None:
        return checkpoints[-1] if checkpoints else None
    for event in reversed(checkpoints):
        if event.get("checkpoint") == number:
            return event
    raise CkptError(f"no checkpoint {number} in the event log "
                    f"(it has {', '.join(str(e.get('checkpoint')) for e in checkpoints) or 'none'})")


def _per_process(event):
    """[(host, pid, stopped_s, write_s, flush_s or None, bytes)] from the
    checkpoint's manifest, or None if it is gone (--keep) or unreadable."""
    try:
        manifest = read_manifest(Path(event["path"]))
    except (CkptError, OSError, KeyError, TypeError, ValueError):
        return None
    if manifest.get("checkpoint") != event.get("checkpoint"):
        return None  # the number was reused by a later run: not this checkpoint's
    rows = []
    for proc in manifest.get("processes") or []:
        flush = proc.get("flush_ns")
        rows.append((proc.get("host"), proc.get("pid"), int(proc.get("stopped_ns", 0)) / 1e9,
                     int(proc.get("write_ns", 0)) / 1e9,
                     None if flush is None else int(flush) / 1e9, int(proc.get("size", 0))))
    return rows


# ---- charts ------------------------------------------------------------------

def _layout(title, **more):
    layout = {"title": {"text": title}, "template": "plotly_white", "height": 360,
              "margin": {"l": 70, "r": 20, "t": 50, "b": 60}, "barmode": "group",
              "legend": {"orientation": "h", "y": -0.2}, "yaxis": {"rangemode": "tozero"}}
    layout.update(more)
    return layout


def _seconds_text(values):
    return [None if v is None else f"{v:.3f} s" for v in values]


def phases_figure(event):
    """The chosen checkpoint's phases, one after the other as the
    coordinator went through them (its wait at each barrier)."""
    import plotly.graph_objects as go
    figure = go.Figure()
    start = 0.0
    for phase, seconds in (event.get("phases") or {}).items():
        figure.add_bar(y=["coordinator"], x=[seconds], base=[start], orientation="h",
                       name=phase, text=[f"{phase} {seconds:.3f} s"], textposition="inside",
                       hovertemplate=f"{phase}: %{{x:.6f}} s<extra></extra>")
        start += seconds
    figure.update_layout(**_layout(f"{_label(event)}: the phases ({start:.3f} s in all)",
                                   barmode="stack", height=300,
                                   legend={"orientation": "h", "y": -0.6}),
                         xaxis_title="seconds from the checkpoint's start")
    return figure


def hosts_figure(event):
    """Each host's slowest process: stopped, write, flush (seconds)."""
    import plotly.graph_objects as go
    hosts = event.get("hosts") or {}
    names = list(hosts)
    figure = go.Figure()
    for key, label in (("stopped_s", "stopped"), ("write_s", "write"), ("flush_s", "flush")):
        values = [hosts[h].get(key) for h in names]
        if all(v is None for v in values):
            continue
        figure.add_bar(x=names, y=values, name=label, marker_color=COLOURS[label],
                       text=_seconds_text(values), textposition="outside")
    figure.update_layout(**_layout(f"{_label(event)}: each host's slowest process"),
                         yaxis_title="seconds", xaxis_title="host")
    return figure


def processes_figure(event, rows):
    """Each process's stopped, write and flush times (from the manifest)."""
    import plotly.graph_objects as go
    names = [f"{host}:{pid}" for host, pid, *_ in rows]
    figure = go.Figure()
    for index, label in ((2, "stopped"), (3, "write"), (4, "flush")):
        values = [row[index] for row in rows]
        if all(v is None for v in values):
            continue
        figure.add_bar(x=names, y=values, name=label, marker_color=COLOURS[label],
                       text=_seconds_text(values), textposition="outside")
    figure.update_layout(**_layout(f"{_label(event)}: each process (host:pid)"),
                         yaxis_title="seconds")
    return figure


def sizes_figure(log):
    """Bytes stored by each checkpoint, full and incremental."""
    import plotly.graph_objects as go
    checkpoints = [e for e in log if e["kind"] == "checkpoint"]
    figure = go.Figure()
    for incremental, label in ((False, "full"), (True, "incremental")):
        chosen = [e for e in checkpoints if bool(e.get("incremental")) == incremental]
        if chosen:
            figure.add_bar(x=[_label(e) for e in chosen], y=[e.get("bytes", 0) for e in chosen],
                           name=label, marker_color=COLOURS[label],
                           text=[human_size(e.get("bytes", 0)) for e in chosen],
                           textposition="outside")
    figure.update_layout(**_layout("Bytes stored by each checkpoint", barmode="overlay"),
                         yaxis_title="bytes",
                         xaxis={"categoryorder": "array",
                                "categoryarray": [_label(e) for e in checkpoints]})
    return figure


def times_figure(log):
    """Durations and the longest stop of each checkpoint, and the restarts'
    durations, in the log's order."""
    import plotly.graph_objects as go
    order = [_label(e) for e in log if e["kind"] in ("checkpoint", "restart", "restart_failed",
                                                       "checkpoint_failed")]
    checkpoints = [e for e in log if e["kind"] == "checkpoint"]
    restarts = [e for e in log if e["kind"] in ("restart", "restart_failed")]
    figure = go.Figure()
    x = [_label(e) for e in checkpoints]
    figure.add_scatter(x=x, y=[e.get("duration_s") for e in checkpoints], name="checkpoint took",
                       mode="lines+markers", marker_color=COLOURS["duration"])
    figure.add_scatter(x=x, y=[e.get("stopped_max_s") for e in checkpoints],
                       name="longest stop", mode="lines+markers",
                       marker_color=COLOURS["stopped"])
    if restarts:
        figure.add_scatter(x=[_label(e) for e in restarts],
                           y=[e.get("duration_s") for e in restarts], name="restart took",
                           mode="markers", marker={"size": 12, "symbol": "diamond",
                                                   "color": COLOURS["restart"]})
    figure.update_layout(**_layout("Durations over the job's checkpoints and restarts"),
                         yaxis_title="seconds",
                         xaxis={"categoryorder": "array", "categoryarray": order})
    return figure


def bandwidth_figure(log):
    """Each host's write bandwidth (its bytes over its slowest write) and,
    staged, flush bandwidth, over the checkpoints."""
    import plotly.graph_objects as go
    checkpoints = [e for e in log if e["kind"] == "checkpoint"]
    hosts = sorted({h for e in checkpoints for h in (e.get("hosts") or {})})
    figure = go.Figure()
    for host in hosts:
        for key, label in (("write_s", "write"), ("flush_s", "flush")):
            x, y = [], []
            for event in checkpoints:
                entry = (event.get("hosts") or {}).get(host) or {}
                if entry.get(key):
                    x.append(_label(event))
                    y.append(entry.get("bytes", 0) / entry[key] / 2**20)
            if x:
                figure.add_scatter(x=x, y=y, name=f"{host} {label}", mode="lines+markers")
    figure.update_layout(**_layout("Write and flush bandwidth per host"), yaxis_title="MiB/s",
                         xaxis={"categoryorder": "array",
                                "categoryarray": [_label(e) for e in checkpoints]})
    return figure


# ---- tables ------------------------------------------------------------------

def _local_time(iso):
    try:
        when = datetime.datetime.fromtimestamp(events.parse_time(iso))
    except (TypeError, ValueError, AttributeError):
        return str(iso)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _cell(value):
    if value is None:
        return "<td></td>"
    if isinstance(value, bool):
        value = "yes" if value else "no"
    if isinstance(value, float):
        value = f"{value:.6f}"  # as the log has them (to the microsecond)
    return f"<td>{html.escape(str(value))}</td>"


def _table(table_id, header, rows):
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return (f'<table id="{table_id}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def checkpoint_rows(log):
    for e in log:
        if e["kind"] != "checkpoint":
            continue
        slowest = e.get("stopped_max_process") or {}
        yield (e.get("checkpoint"), _local_time(e.get("time")), e.get("duration_s"),
               e.get("stopped_max_s"), f"{slowest.get('host')}:{slowest.get('pid')}",
               e.get("bytes"), human_size(e.get("bytes") or 0), e.get("processes"),
               e.get("incremental"), e.get("staged"), len(e.get("warnings") or ()))


def restart_rows(log):
    for e in log:
        if e["kind"] in ("restart", "restart_failed"):
            mapping = ", ".join(f"{a}→{b}" if a != b else a
                                for a, b in (e.get("hosts") or {}).items())
            yield (e.get("checkpoint"), _local_time(e.get("time")), e.get("duration_s"),
                   e.get("bytes"), e.get("processes"), mapping,
                   "ok" if e["kind"] == "restart" else f"failed: {e.get('error')}")


def failure_rows(log):
    for e in log:
        if e["kind"] in FAILURES:
            what = e.get("error") or (f"{e.get('processes')} processes there"
                                      if e["kind"] == "host_lost" else "")
            yield (_local_time(e.get("time")), e["kind"], _label(e), what)


def warning_rows(log):
    for e in log:
        for warning in e.get("warnings") or ():
            yield (_local_time(e.get("time")), _label(e), warning)


def host_rows(event):
    for host, entry in (event.get("hosts") or {}).items():
        yield (host, entry.get("processes"), entry.get("bytes"), entry.get("stopped_s"),
               entry.get("write_s"), entry.get("flush_s"))


# ---- the page ----------------------------------------------------------------

STYLE = """
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
.note { color: #666; } .plot { min-height: 260px; }
"""

# renders every chart; the body says when all are drawn (data-plots) and
# any script error (data-errors): what a browser test reads
SCRIPT = """
window.addEventListener("error", function (e) {
  document.body.dataset.errors = (document.body.dataset.errors || "") + e.message + "\\n";
});
const CONFIG = {displaylogo: false, responsive: true};
Promise.all(PLOTS.map(function (p) {
  return Plotly.newPlot(p.id, p.figure.data, p.figure.layout, CONFIG);
})).then(function () {
  document.body.dataset.plots = "rendered " + PLOTS.length;
}, function (error) {
  document.body.dataset.errors = (document.body.dataset.errors || "") + error + "\\n";
});
"""


def render(job_dir, log, number=None, plotly_js=None):
    """The page, as text."""
    import plotly.io
    import plotly.offline
    chosen = _chosen(log, number)
    job_id = next((e.get("job_id") for e in reversed(log) if e.get("job_id")), Path(job_dir).name)
    plots, sections = [], []

    def plot(plot_id, figure):
        plots.append({"id": plot_id, "figure": json.loads(plotly.io.to_json(figure,
                                                                            validate=False))})
        return f'<div class="plot" id="{plot_id}"></div>'

    kinds = [e["kind"] for e in log]
    summary = (f"{kinds.count('checkpoint')} checkpoints, {kinds.count('restart')} restarts, "
               f"{sum(kinds.count(k) for k in FAILURES)} "
               f"failures, {sum(1 for _ in warning_rows(log))} warnings; "
               f"from {_local_time(log[0].get('time'))} to {_local_time(log[-1].get('time'))}")
    if log.malformed or log.other_versions:
        summary += (f". Skipped: {log.malformed} malformed lines, {log.other_versions} lines of "
                    "another format version")
    sections.append(f'<p id="summary">{html.escape(summary)}</p>')
    if chosen is not None:
        sections.append(f'<h2 id="chosen">Where the time of {_label(chosen)} went</h2>')
        sections.append(f'<p class="note">taken {_local_time(chosen.get("time"))} in '
                        f'{chosen.get("duration_s", 0):.3f} s, {human_size(chosen.get("bytes", 0))}'
                        f', {chosen.get("processes")} processes; the longest stop '
                        f'{chosen.get("stopped_max_s", 0):.3f} s '
                        f'({html.escape(str((chosen.get("stopped_max_process") or {}).get("host")))}'
                        f':{(chosen.get("stopped_max_process") or {}).get("pid")})</p>')
        sections.append(plot("plot-phases", phases_figure(chosen)))
        sections.append(plot("plot-hosts", hosts_figure(chosen)))
        sections.append(_table("table-hosts", ["host", "processes", "bytes", "stopped s",
                                               "write s", "flush s"], host_rows(chosen)))
        rows = _per_process(chosen)
        if rows:
            sections.append(plot("plot-processes", processes_figure(chosen, rows)))
            sections.append(_table("table-processes", ["host", "pid", "stopped s", "write s",
                                                       "flush s", "bytes"], rows))
        else:
            sections.append('<p class="note" id="no-processes">Its manifest is gone (or '
                            'unreadable): the per-process times are not known, only each '
                            "host's slowest.</p>")
        sections.append('<h2>Over the job\'s checkpoints and restarts</h2>')
        sections.append(plot("plot-sizes", sizes_figure(log)))
        sections.append(plot("plot-times", times_figure(log)))
        sections.append(plot("plot-bandwidth", bandwidth_figure(log)))
    else:
        sections.append('<p class="note" id="no-checkpoints">No checkpoint was published.</p>')
    sections.append("<h2>Checkpoints</h2>" + _table(
        "table-checkpoints", ["checkpoint", "time", "duration s", "longest stop s",
                              "stopped longest", "bytes", "size", "processes", "incremental",
                              "staged", "warnings"], checkpoint_rows(log)))
    sections.append("<h2>Restarts</h2>" + _table(
        "table-restarts", ["checkpoint", "time", "duration s", "bytes", "processes",
                           "hosts (then→now)", "outcome"], restart_rows(log)))
    sections.append("<h2>Failures</h2>" + _table(
        "table-failures", ["time", "kind", "what", "error"], failure_rows(log)))
    sections.append("<h2>Warnings</h2>" + _table(
        "table-warnings", ["time", "of", "warning"], warning_rows(log)))
    title = f"ckpt report: job {job_id}"
    js = plotly_js if plotly_js is not None else plotly.offline.get_plotlyjs()
    data = json.dumps(plots).replace("</", "<\\/")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="generator" content="ckpt report {REPORT_VERSION}">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style>"
            f"<script>{js}</script></head>\n<body>"
            f"<h1>{html.escape(title)}</h1>"
            f'<p class="note">{html.escape(str(Path(job_dir).resolve()))}, '
            f"{html.escape(events.EVENTS_NAME)}</p>"
            + "\n".join(sections)
            + f"<script>const PLOTS = {data};\n{SCRIPT}</script></body></html>\n")


def write_report(job, output, number=None, warn=print):
    """Builds the report of job (a job directory or id) into output; returns
    (the job directory, the log)."""
    job_dir = job_directory(job)
    log = load(job_dir, warn)
    page = render(job_dir, log, number)
    output = Path(output)
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        tmp.write_text(page)
        tmp.replace(output)
    except OSError as exc:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        raise CkptError(f"cannot write {output}: {exc.strerror or exc}") from None
    return job_dir, log
