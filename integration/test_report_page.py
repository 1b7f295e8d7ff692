"""`ckpt report` of a real job (several checkpoints, full and incremental,
a restart, a failed restart), opened in a real headless browser (Debian's
chromium, driven through its chromedriver by selenium): every chart drawn
(an svg with its traces), nothing logged on the browser's console, and the
page's tables and chart labels say what the event log and the manifests
say."""
import json
import os
import shutil
from html.parser import HTMLParser

import pytest

from ckpt import manifest as manifests
from ckpt.job_status import human_size
from harness import Job, Restart

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:   # setup.sh installs it
    webdriver = None
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
BROWSER = None if webdriver is None or CHROMIUM is None or CHROMEDRIVER is None else CHROMIUM
NO_BROWSER = "needs Debian's chromium and chromium-driver, and selenium (setup.sh installs them)"
COUNTER = ["counter", "600", "10"]
PLOTS = ["plot-phases", "plot-hosts", "plot-processes", "plot-sizes", "plot-times",
         "plot-bandwidth"]


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.children, self.text = [], ""

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def find_all(self, tag=None, cls=None):
        return [n for n in self.walk() if (tag is None or n.tag == tag) and
                (cls is None or cls in n.attrs.get("class", "").split())]

    def all_text(self):
        return self.text + "".join(child.all_text() for child in self.children)


class Tree(HTMLParser):
    """The DOM of the page as chromium left it, as a tree of Nodes (the stdlib's parser)."""
    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "wbr"}

    def __init__(self, text):
        super().__init__()
        self.root = self.at = Node("#root", {}, None)
        self.by_id = {}
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.at)
        self.at.children.append(node)
        if "id" in node.attrs:
            self.by_id[node.attrs["id"]] = node
        if tag not in self.VOID:
            self.at = node

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.at = self.at.parent

    def handle_endtag(self, tag):
        node = self.at
        while node is not None and node.tag != tag:
            node = node.parent
        if node is not None and node.parent is not None:
            self.at = node.parent

    def handle_data(self, data):
        self.at.text += data


# each plotly chart of the page: its id, the svgs plotly drew, the traces
# of its figure and the trace groups drawn for them
DRAWN = """
return Array.from(document.querySelectorAll("div.js-plotly-plot")).map(function (div) {
  return {id: div.id, svgs: div.querySelectorAll("svg.main-svg").length,
          traces: (div.data || []).length, drawn: div.querySelectorAll("g.trace").length};
});
"""


def browse(page, tmp_path, timeout=120):
    """(the DOM once its charts are drawn, the browser's console entries,
    {chart id: what was drawn}): the page opened in headless chromium
    through chromedriver, until its body says the charts are drawn (or a
    script failed)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(page.as_uri())
        WebDriverWait(driver, timeout).until(lambda d: d.execute_script(
            "return document.body.dataset.plots || document.body.dataset.errors"))
        drawn = {chart["id"]: chart for chart in driver.execute_script(DRAWN)}
        dom = driver.execute_script("return document.documentElement.outerHTML")
        console = driver.get_log("browser")
    finally:
        driver.quit()
    return Tree(dom), console, drawn


def all_drawn(tree, drawn, plots):
    """Every chart of plots drawn: the body says so, no script error, and
    each chart's svg holds a drawn group for every trace of its figure."""
    body = tree.root.find_all("body")[0]
    assert body.attrs.get("data-plots") == f"rendered {len(plots)}", body.attrs
    assert "data-errors" not in body.attrs, body.attrs["data-errors"]
    assert sorted(drawn) == sorted(plots), drawn
    for chart in drawn.values():
        assert chart["svgs"] > 0 and chart["traces"] > 0, chart
        assert chart["drawn"] >= chart["traces"], chart


def rows(tree, table_id):
    table = tree.by_id[table_id]
    return [[td.all_text() for td in tr.find_all("td")]
            for tr in table.find_all("tr") if tr.find_all("td")]


def seconds(value):
    return f"{value:.6f}"


@pytest.mark.skipif(BROWSER is None, reason=NO_BROWSER)
def test_report_of_a_real_job_in_a_browser(session, tmp_path):
    job = Job(session, "reported", *COUNTER, launch_args=("--incremental",))
    job.wait_ready()
    job.checkpoint()
    second = job.checkpoint()
    job.kill()
    restarted = job.restart_held(second)
    third = job.checkpoint()
    fourth = job.checkpoint()
    job.s.ckpt("kill", job.id)
    restarted.wait()
    # a restart that fails: a byte of the newest image changed
    image = fourth / manifests.read_manifest(fourth)["processes"][0]["image"]
    with open(image, "r+b") as corrupt:
        corrupt.seek(image.stat().st_size // 2)
        byte = corrupt.read(1)
        corrupt.seek(-1, os.SEEK_CUR)
        corrupt.write(bytes([byte[0] ^ 0xFF]))
    failed = Restart(session, fourth)
    assert failed.wait() != 0
    job_dir = session.images / job.id
    logged = [json.loads(line) for line in (job_dir / "events.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in logged] == ["checkpoint", "checkpoint", "restart", "checkpoint",
                                           "checkpoint", "restart_failed"]
    checkpoints = [e for e in logged if e["kind"] == "checkpoint"]
    assert [e["incremental"] for e in checkpoints] == [False, True, True, True]

    page = tmp_path / "report.html"
    made = session.ckpt("report", job_dir, "-o", page)
    assert made.stdout == f"{page}\n" and made.stderr == ""
    text = page.read_text()
    # self-contained: no script, style or font fetched from elsewhere
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    tree, console, drawn = browse(page, tmp_path)
    assert console == [], console   # no error, nor anything else, on the console
    all_drawn(tree, drawn, PLOTS)

    # the newest checkpoint in detail: its phases, hosts and processes
    newest = checkpoints[-1]
    phase_labels = [t.all_text() for t in tree.by_id["plot-phases"].find_all("text", "bartext")]
    assert sorted(phase_labels) == sorted(f"{phase} {s:.3f} s"
                                          for phase, s in newest["phases"].items())
    assert rows(tree, "table-hosts") == [
        [host, str(h["processes"]), str(h["bytes"]), seconds(h["stopped_s"]),
         seconds(h["write_s"]), seconds(h["flush_s"]) if "flush_s" in h else ""]
        for host, h in newest["hosts"].items()]
    manifest = manifests.read_manifest(fourth)
    assert rows(tree, "table-processes") == [
        [p["host"], str(p["pid"]), seconds(p["stopped_ns"] / 1e9), seconds(p["write_ns"] / 1e9),
         "", str(p["size"])] for p in manifest["processes"]]
    drawn = [t.all_text() for t in tree.by_id["plot-processes"].find_all("text", "bartext")]
    assert f"{manifest['processes'][0]['stopped_ns'] / 1e9:.3f} s" in drawn

    # over the job: a bar per checkpoint labelled with its size, full or incremental
    sizes = tree.by_id["plot-sizes"]
    assert len(sizes.find_all("g", "point")) == len(checkpoints)
    labels = [t.all_text() for t in sizes.find_all("text", "bartext")]
    assert labels == [human_size(e["bytes"]) for e in checkpoints]
    legend = [t.all_text() for t in sizes.find_all("text", "legendtext")]
    assert legend == ["full", "incremental"]
    ticks = [t.all_text() for t in tree.by_id["plot-times"].find_all("text")
             if "xtick" in (t.parent.attrs.get("class", "") if t.parent else "")]
    assert ticks == ["ckpt-0001", "ckpt-0002", "restart from ckpt-0002", "ckpt-0003",
                     "ckpt-0004", "restart from ckpt-0004 failed"], ticks
    table = rows(tree, "table-checkpoints")
    assert [row[:1] + row[2:] for row in table] == [
        [str(e["checkpoint"]), seconds(e["duration_s"]), seconds(e["stopped_max_s"]),
         f"{e['stopped_max_process']['host']}:{e['stopped_max_process']['pid']}",
         str(e["bytes"]), human_size(e["bytes"]), str(e["processes"]),
         "yes" if e["incremental"] else "no", "no", str(len(e["warnings"]))]
        for e in checkpoints]
    restarts = rows(tree, "table-restarts")
    assert [r[0] for r in restarts] == ["2", "4"] and restarts[0][-1] == "ok"
    assert restarts[1][-1] == f"failed: {logged[-1]['error']}"
    assert rows(tree, "table-failures") == [
        [restarts[1][1], "restart_failed", "restart from ckpt-0004 failed", logged[-1]["error"]]]
    summary = tree.by_id["summary"].all_text()
    assert summary.startswith("4 checkpoints, 1 restarts, 1 failures, 0 warnings")
