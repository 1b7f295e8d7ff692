"""How `ckpt restart` starts the ckpt-restart of a host other than its own:
through ssh, or through srun as a step of the Slurm allocation it runs in
(many sites forbid ssh between compute nodes).  The setting `launcher`
(--launcher, CKPT_LAUNCHER) is auto (srun inside an allocation, else
ssh), ssh or srun."""

import os
import shlex

from ckpt.errors import CkptError
from ckpt.native import cli_path

JOB_VARIABLES = ("CKPT_COORD", "CKPT_JOB_ID", "CKPT_COORD_TCP", "CKPT_SECRET_FILE", "CKPT_AGENT")


def over_ssh(host, argv, env):
    """(argv, env) that run argv on host under the job's agent, through
    ssh: the job's variables go on the command line.  The shell starts
    argv (ckpt-restart, which checks its images meanwhile) and then becomes
    the agent (`ckpt agent --adopt`), whose start-up then costs nothing."""
    job_vars = ["env", *(f"{k}={v}" for k, v in sorted(env.items()) if k in JOB_VARIABLES)]
    agent = ["exec", *job_vars, str(cli_path()), "agent", "--adopt"]
    script = f"{_words(job_vars + list(argv))} </dev/null & {_words(agent)} $!"
    # curve25519 first: OpenSSH 9's default key exchange (sntrup761 hybrid)
    # costs 70 ms more per connection, on the restart's critical path; the
    # other algorithms stay for servers without it
    return ["ssh", "-T", "-o", "KexAlgorithms=^curve25519-sha256", host,
            _words(["exec", "/bin/sh", "-c", script])], dict(os.environ)


def _words(argv):
    return " ".join(shlex.quote(str(word)) for word in argv)


def over_srun(host, argv, env):
    """The same through srun, as a step of one task on host in the current
    allocation (srun hands the job's variables on in the environment);
    --overlap: the job's own steps may hold every CPU there."""
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
            "--input=none", str(cli_path()), "agent", "--run", "--", *argv], env


def remote_starter(setting, remote_hosts, environ=None):
    """over_ssh or over_srun, as setting says, for a restart that starts
    ckpt-restart on remote_hosts (the new hosts other than this one).
    srun (asked for, or auto inside an allocation) is refused in one line
    outside an allocation or for a host outside it, before anything starts."""
    environ = os.environ if environ is None else environ
    allocation = environ.get("SLURM_JOB_ID")
    if setting == "ssh" or not remote_hosts or (setting == "auto" and not allocation):
        return over_ssh
    if not allocation:
        raise CkptError("--launcher srun: not inside a Slurm allocation (no SLURM_JOB_ID): run "
                        "ckpt restart inside salloc or sbatch, or use --launcher ssh",
                        exit_code=2)
    from ckpt.slurm import allocation_nodes, nodelist_of
    nodes = allocation_nodes(environ)
    outside = [host for host in remote_hosts if host not in nodes]
    if outside:
        raise CkptError(f"srun cannot start the restart on {', '.join(outside)}: not a node of "
                        f"Slurm job {allocation} ({nodelist_of(environ)}); give the allocation's "
                        "nodes, or --launcher ssh", exit_code=2)
    return over_srun
