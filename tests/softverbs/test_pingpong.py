"""ibv_{rc,uc,ud,srq}_pingpong from Debian's ibverbs-utils, server and client
as two processes on localhost, over softverbs."""
import re
import subprocess

import pytest

from conftest import free_port, wait_listening

CASES = [
    ("ibv_rc_pingpong", []),
    ("ibv_rc_pingpong", ["-e"]),
    ("ibv_rc_pingpong", ["-c", "-s", "300000", "-n", "50"]),
    ("ibv_rc_pingpong", ["-g", "0", "-m", "2048", "-s", "8", "-n", "2000"]),
    ("ibv_ud_pingpong", ["-g", "0"]),
    ("ibv_ud_pingpong", ["-e", "-g", "0"]),
    ("ibv_ud_pingpong", ["-s", "64", "-n", "2000"]),
    ("ibv_uc_pingpong", []),
    ("ibv_uc_pingpong", ["-e", "-s", "60000", "-n", "200"]),
    ("ibv_srq_pingpong", []),
    ("ibv_srq_pingpong", ["-e"]),
    ("ibv_srq_pingpong", ["-q", "4", "-n", "500"]),
]

ADDR = re.compile(r"(local|remote) address:\s+LID 0x([0-9a-f]+), QPN 0x([0-9a-f]+)")


def addresses(out, kind):
    return [(int(l, 16), int(q, 16)) for k, l, q in ADDR.findall(out)
            if k == kind]


@pytest.mark.parametrize("prog,args", CASES,
                         ids=[p + "".join(a[:2]) for p, a in CASES])
def test_pingpong(sv_env, prog, args):
    port = free_port()
    base = [prog, "-d", "sv0", "-p", str(port)] + args
    srv = subprocess.Popen(base, env=sv_env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        wait_listening(port, srv)
        cli = subprocess.run(base + ["localhost"], env=sv_env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=60)
        sout = srv.communicate(timeout=60)[0]
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait()
    assert cli.returncode == 0, cli.stdout
    assert srv.returncode == 0, sout
    iters = int(args[args.index("-n") + 1]) if "-n" in args else 1000
    for out in (sout, cli.stdout):
        assert re.search(r"^\d+ bytes in [\d.]+ seconds = [\d.]+ Mbit/sec$",
                         out, re.M), out
        assert re.search(r"^%d iters in [\d.]+ seconds" % iters, out, re.M), out
    # each side talked to the QPs the other side created
    assert sorted(addresses(sout, "local")) == sorted(addresses(cli.stdout, "remote"))
    assert sorted(addresses(cli.stdout, "local")) == sorted(addresses(sout, "remote"))
    lids = {l for l, q in addresses(sout, "local") + addresses(cli.stdout, "local")}
    assert len(lids) == 1 and 0 < lids.pop() < 0xc000
