"""A ring in mpi4py: each rank passes a mixed token to the next, with
nonblocking sends, and rank 0 prints the XOR of every rank's hash."""
import os
import sys
import time

from mpi4py import MPI

MASK = (1 << 64) - 1


def mix(h, v):
    h ^= (v + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2)) & MASK
    return (h * 0xFF51AFD7ED558CCD) & MASK


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    pace = float(sys.argv[2]) / 1000 if len(sys.argv) > 2 else 0.01
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    h = mix(0, rank)
    if rank == 0:
        print("READY", flush=True)
    for step in range(steps):
        req = comm.isend(mix(h, step), dest=(rank + 1) % size, tag=7)
        got = comm.recv(source=(rank - 1) % size, tag=7)
        req.wait()
        h = mix(h, got)
        time.sleep(pace)
    # held while the harness's $ZDTM_HOLD exists, as ring.c
    while os.path.exists(os.environ.get("ZDTM_HOLD", "")):
        time.sleep(0.01)
    total = comm.reduce(h, op=MPI.BXOR, root=0)
    if rank == 0:
        print(f"RESULT {total:016x}\nPASS", flush=True)


main()
