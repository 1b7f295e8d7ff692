import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import REPO, Session, User, become_subreaper, reap_orphans

UNPRIVILEGED_UID = 4242


@pytest.fixture(scope="session", autouse=True)
def built():
    """Native code and test programs, built once per run."""
    subprocess.run(["make", "-s", "-C", str(REPO / "native")], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "apps")], check=True)
    subprocess.run(["make", "-s", "-C", str(REPO / "plugins" / "ib")], check=True)
    become_subreaper()
    yield
    reap_orphans()


@pytest.fixture
def rng():
    seed = int(os.environ.get("CKPT_TEST_SEED", random.randrange(1 << 30)))
    print(f"random seed {seed} (CKPT_TEST_SEED to repeat)")
    return random.Random(seed)


@pytest.fixture
def session(tmp_path, rng):
    s = Session(tmp_path, rng=rng)
    yield s
    s.end()


@pytest.fixture
def unprivileged_session(rng):
    if os.getuid() != 0:
        pytest.skip("needs root to switch to an unprivileged uid")
    # not under pytest's basetemp: pytest keeps that private (0700)
    root = Path(tempfile.mkdtemp(prefix="ckpt-unpriv-", dir="/tmp"))
    os.chmod(root, 0o755)
    s = Session(root / "s", user=User(uid=UNPRIVILEGED_UID), rng=rng)
    yield s
    s.end()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    """A 4-host test cluster (integration/cluster.py), once per session."""
    import atexit
    from cluster import Cluster, ClusterUnavailable
    try:
        c = Cluster(n=4).start()
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    atexit.register(c.stop)    # interrupted runs too (stop() is idempotent)
    yield c
    c.stop()


@pytest.fixture(scope="session")
def slurm(cluster):
    """Slurm (slurmctld on h1, munged and slurmd on every host) on the
    session's test cluster (integration/slurm_cluster.py), with the
    project's prolog, epilog and task prolog."""
    import atexit
    from slurm_cluster import SlurmCluster, why_unavailable
    reason = why_unavailable()
    if reason:
        pytest.skip(reason)
    hooks = REPO / "plugins" / "slurm"
    s = SlurmCluster(cluster, prolog=hooks / "prolog", epilog=hooks / "epilog",
                     task_prolog=hooks / "task_prolog").start()
    atexit.register(s.stop)    # before cluster.stop (atexit runs in reverse)
    yield s
    s.stop()
