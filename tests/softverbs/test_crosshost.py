"""The UDP path between hosts.  Two "hosts" are simulated on this machine
with SOFTVERBS_ADDR=127.0.0.2 / 127.0.0.3 sharing one SOFTVERBS_DIR (as a
cluster would share it over NFS): each gets its own device incarnation and
LID, and QPs of the other host are reached over UDP."""
import re
import subprocess

import pytest

from conftest import free_port, wait_listening

ADDR = re.compile(r"(local|remote) address:\s+LID 0x([0-9a-f]+), QPN 0x([0-9a-f]+)")


@pytest.mark.parametrize("prog,args", [
    ("ibv_rc_pingpong", ["-s", "200000", "-n", "50", "-c"]),
    ("ibv_rc_pingpong", ["-e"]),
    ("ibv_ud_pingpong", ["-g", "0"]),
    ("ibv_srq_pingpong", ["-q", "4", "-n", "500"]),
])
def test_pingpong_two_hosts(sv_env, prog, args):
    port = free_port()
    base = [prog, "-d", "sv0", "-p", str(port)] + args
    env_a = dict(sv_env, SOFTVERBS_ADDR="127.0.0.2")
    env_b = dict(sv_env, SOFTVERBS_ADDR="127.0.0.3")
    srv = subprocess.Popen(base, env=env_a, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(port, srv)
        cli = subprocess.run(base + ["localhost"], env=env_b,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=60)
        sout = srv.communicate(timeout=60)[0]
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0 and srv.returncode == 0, sout + cli.stdout
    for out in (sout, cli.stdout):
        assert re.search(r"^\d+ bytes in [\d.]+ seconds", out, re.M), out
    slids = {int(l, 16) for k, l, q in ADDR.findall(sout) if k == "local"}
    clids = {int(l, 16) for k, l, q in ADDR.findall(cli.stdout) if k == "local"}
    assert len(slids) == 1 and len(clids) == 1 and slids != clids
    # each device's GUID/GID carries its host's address
    if "-g" in args:
        assert "fe80::253:5600:7f00:2" in sout
        assert "fe80::253:5600:7f00:3" in cli.stdout


def test_ud_alltoall_two_hosts(cbin, sv_env, tmp_path):
    n, per = 8, 30
    exe = cbin("ud_alltoall")
    procs = [subprocess.Popen(
        [exe, str(r), str(n), str(tmp_path), str(per)],
        env=dict(sv_env, SOFTVERBS_ADDR="127.0.0.%d" % (2 + r % 2)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(n)]
    outs = [p.communicate(timeout=90)[0] for p in procs]
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and out.strip() == "OK %d %d" % (r, (n - 1) * per), out
    lids = {(tmp_path / ("%d.info" % r)).read_text().split()[0] for r in range(n)}
    assert len(lids) == 2
