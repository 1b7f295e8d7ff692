"""C unit tests (qp_test.c) and the 16-process UD all-to-all."""
import os
import subprocess

import pytest

QP_TESTS = ["state_machine", "rc_transfer", "rc_errors", "ud", "events",
            "srq", "uc", "ext_ops", "mr_access", "async_destroy"]


@pytest.mark.parametrize("name", QP_TESTS)
def test_qp(cbin, sv_env, name):
    p = subprocess.run([cbin("qp_test"), name], env=sv_env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok " + name, p.stdout


def test_qpn_fresh_per_incarnation(cbin, sv_env, tmp_path):
    """A restarted job (new incarnation) sees different LIDs and QPNs."""
    def run_once():
        d = tmp_path / ("a2a-%d" % len(list(tmp_path.iterdir())))
        d.mkdir()
        p = subprocess.run([cbin("ud_alltoall"), "0", "1", str(d), "1"],
                           env=sv_env, stdout=subprocess.PIPE, text=True,
                           timeout=30)
        assert p.returncode == 0, p.stdout
        return (d / "0.info").read_text().split()
    first, second = run_once(), run_once()
    assert first[0] != second[0] and first[1] != second[1]


def test_ud_alltoall_16(cbin, sv_env, tmp_path):
    n, per = 16, 40
    exe = cbin("ud_alltoall")
    procs = [subprocess.Popen([exe, str(r), str(n), str(tmp_path), str(per)],
                              env=sv_env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=90)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert out.strip() == "OK %d %d" % (r, (n - 1) * per), out
    # every rank had its own QP, all on the one device LID
    infos = [(tmp_path / ("%d.info" % r)).read_text().split() for r in range(n)]
    assert len({i[0] for i in infos}) == 1
    assert len({i[1] for i in infos}) == n
