"""The driver: a render from options to outcomes. `request` holds one render as asked for; `render`
puts it together; `plan_report` is what `farm plan` prints; `validate` checks
everything before OUT or a cluster is touched; `resume` says what an output is a render of and what
is left; `cluster` joins or starts a cluster through a backend (`backends`: one module per backend and
farm's worker set-up; `machine`: this machine's GPUs and cores; `clusterd`: `farm cluster`, `tls`: its
certificates; `srun`: the program that runs farm inside a SLURM allocation);
`graph` runs a schedule on Dask through a bounded window; `timeline` keeps the render's
``OUT/timeline.otio`` as shots finish.

May import every package below it (`farm.planning`, `farm.store`, `farm.inputs`, `farm.worker`'s task
functions, `farm.dashboard`, `farm.media`, `farm.decoders`, `farm.version`) and Dask distributed;
torch and diffusers never at module level (`tests/test_driver_boundary.py`).
"""
