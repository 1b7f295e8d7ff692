import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness import REPO, Session, User, become_subreaper, reap_orphans

UNPRIVILEGED_UID = 4242

# The quick tier (`./run-tests.sh --quick`, marker `quick`; every unit test
# is in it too): a few end-to-end tests of each area, a few minutes in all
# (3-4 min on 2 cores; the stress tests, 20-40 s each, stay in the full run).
# file -> test -> the parameter ids in the tier (None: the test as a whole).
QUICK = {
    "test_engine.py": {
        "test_checkpointed_runs_on_unchanged_and_restarts_from_first_and_last":
            ["threads", "files", "sockets", "proctree", "pipe_states", "sharedmem", "ptys"],
        "test_restart_twice_in_a_chain": ["counter"],
        "test_unprivileged_user": ["counter"],
    },
    "test_mpi.py": {"test_mpi_checkpoint_kill_restart": ["mpich-2-ring"]},
    "test_ib.py": {"test_pingpong_checkpoint_kill_restart": ["ud--18600"]},
    "test_mpi_verbs.py": {"test_over_verbs_checkpoint_restart": ["mpich-ud_verbs-ring"]},
    "test_multihost.py": {"test_restart_on_same_other_and_swapped_hosts": ["mpich"]},
    "test_fuzz_images.py": {"test_fuzzed_checkpoints_fail_cleanly": None},
    "test_incremental.py": {"test_incremental_checkpoints_restart": ["threads"]},
    "test_compression.py": {"test_compressed_checkpoints_restart": ["counter-zstd"]},
    "test_lazy.py": {"test_lazy_restart_restores_every_page": ["incremental-zstd"],
                     "test_page_server_killed_ends_the_job": None},
    "test_staging.py": {"test_staged_checkpoints_restart": ["proctree"]},
    "test_faults.py": {"test_corrupt_image_is_refused_before_restoring": None,
                       "test_full_disk_abandons_checkpoint_and_job_keeps_running": None},
    "test_fault_matrix.py": {"test_fault_during_checkpoint": ["STOP-rank"]},
    "test_status.py": {"test_event_log_status_and_list": None,
                       "test_progress_on_a_terminal_and_none_without": None,
                       "test_completion_of_job_ids_and_checkpoint_directories": None},
}
HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)     # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(item.path).resolve()
        if path.parent != HERE or path.name not in QUICK:
            continue
        name = getattr(item, "originalname", item.name)
        if name not in QUICK[path.name]:
            continue
        ids = QUICK[path.name][name]
        callspec = getattr(item, "callspec", None)
        if ids is None or (callspec is not None and callspec.id in ids):
            item.add_marker(pytest.mark.quick)


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


@pytest.fixture(autouse=True)
def slurm_controller_kept(request):
    """After every test that used Slurm: its controller still runs.  One
    that died is started again and this test fails with its log."""
    yield
    if "slurm" not in request.fixturenames:
        return
    lost = request.getfixturevalue("slurm").controller_lost()
    if lost:
        pytest.fail(lost)
