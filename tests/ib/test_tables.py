"""The IB plugin's translation tables, receive log and transition history,
compiled with the plugin's own sources and run."""
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugins" / "ib"


def test_tables(tmp_path):
    exe = tmp_path / "tables_test"
    sources = [Path(__file__).with_name("tables_test.c")] + [
        PLUGIN / name for name in ("idmap.c", "recvlog.c", "history.c")]
    subprocess.run(["cc", "-O1", "-g", "-Wall", "-Werror", f"-I{PLUGIN}",
                    f"-I{REPO / 'native' / 'include'}", "-o", str(exe), *map(str, sources),
                    "-lpthread"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["ok idmap", "ok recv log", "ok history"]
