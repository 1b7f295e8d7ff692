#!/bin/sh
# A Slurm batch job under ckpt.  Copy it, adapt the #SBATCH lines, submit:
#
#     sbatch ckpt-job.sh mpirun ./app ARGS...
#     sbatch ckpt-job.sh srun --mpi=pmi2 ./app ARGS...     (MPICH)
#
# Two minutes before the time limit Slurm sends USR1 to this script: ckpt
# checkpoints the job, requeues it and gives the allocation back; the
# requeued job restarts from that checkpoint on whatever nodes it gets, as
# often as needed, until the application ends (the job's exit status is
# the application's).  The periodic checkpoint is what a preemption or a
# lost node restarts from.  The slurm.conf lines ckpt needs (its prolog,
# task prolog and epilog; JobRequeue) are in ckpt's README.
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=01:00:00
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR1@120
#SBATCH --output=ckpt-job-%j.out

# checkpoints go to a filesystem every node sees
: "${CKPT_DIR:=$HOME/ckpt}"
: "${CKPT_INTERVAL:=1800}"

if [ $# -eq 0 ]; then
	echo "usage: sbatch $0 COMMAND [ARGS...]" >&2
	exit 2
fi
exec ckpt slurm run --ckpt-dir "$CKPT_DIR" --interval "$CKPT_INTERVAL" -- "$@"
