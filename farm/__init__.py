"""farm: decode video-diffusion latents on a Dask GPU farm.

The Python API, importable from ``farm`` itself (docs/architecture.md):

>>> import farm
>>> farm.synth("job.zarr", decoder="ltx2-tiny", shots=2, frames=17)        # doctest: +SKIP
>>> job = farm.open_job("job.zarr")                                          # doctest: +SKIP
>>> plans = farm.plan(job, farm.PlanOptions(tiles=(1, 2, 2)), n_workers=4)   # doctest: +SKIP
>>> print(farm.plan_report("job.zarr", n_workers=4).table())                 # doctest: +SKIP
>>> stats = farm.render("job.zarr", "out", workers=2)                       # doctest: +SKIP
>>> farm.Output(Path("out")).video("shot000")                                # doctest: +SKIP

Each name is imported from its package on first use (PEP 562), so ``import farm`` stays light: it
loads neither Dask distributed nor torch nor diffusers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from farm import config  # noqa: F401  (registers farm's defaults in dask.config)
from farm.errors import FarmError
from farm.version import DISTRIBUTION as DISTRIBUTION
from farm.version import __version__ as __version__

if TYPE_CHECKING:
    from farm.inputs.ingest import IngestResult as IngestResult
    from farm.inputs.ingest import ingest as ingest
    from farm.inputs.synthetic import synth as synth
    from farm.media.settings import VideoSettings as VideoSettings
    from farm.planning.jobplan import plan_job as plan  # noqa: F401
    from farm.planning.options import PlanOptions as PlanOptions
    from farm.planning.tiling import ShotPlan as ShotPlan
    from farm.run.graph import RenderStats as RenderStats
    from farm.run.plan_report import PlanReport as PlanReport
    from farm.run.plan_report import plan_report as plan_report
    from farm.run.render import render as render
    from farm.store.job import Job as Job
    from farm.store.job import open_job as open_job
    from farm.store.output import Output as Output


# the public name -> (module, its name there)
_API = {
    "render": ("farm.run.render", "render"),
    "RenderStats": ("farm.run.graph", "RenderStats"),
    "plan": ("farm.planning.jobplan", "plan_job"),
    "plan_report": ("farm.run.plan_report", "plan_report"),
    "PlanReport": ("farm.run.plan_report", "PlanReport"),
    "PlanOptions": ("farm.planning.options", "PlanOptions"),
    "ShotPlan": ("farm.planning.tiling", "ShotPlan"),
    "synth": ("farm.inputs.synthetic", "synth"),
    "ingest": ("farm.inputs.ingest", "ingest"),
    "IngestResult": ("farm.inputs.ingest", "IngestResult"),
    "Job": ("farm.store.job", "Job"),
    "open_job": ("farm.store.job", "open_job"),
    "Output": ("farm.store.output", "Output"),
    "VideoSettings": ("farm.media.settings", "VideoSettings"),
}


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'farm' has no attribute {name!r}")
    module, attribute = _API[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})


__all__ = ["FarmError", "__version__", *_API]
