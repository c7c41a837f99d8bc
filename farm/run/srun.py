"""``srun -n N python -m farm.run.srun COMMAND ARGS…`` inside a SLURM allocation: task 0 the scheduler,
task 1 ``farm COMMAND ARGS… --scheduler ADDRESS``, the others workers (dask-jobqueue's ``SLURMRunner``;
`farm.run.backends.slurm.run_in_allocation` says how)."""

from __future__ import annotations

import sys

from farm.run.backends.slurm import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
