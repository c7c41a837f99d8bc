"""What `farm plan` prints, as one value: `plan_report` plans a job for the workers ``farm render``
would run here (or a given number), checks that the plans fit the cost model's GPU and predicts the
render as it would run (its memory-budget window, the I/O workers a local GPU cluster starts). The
command prints it; the API has it as `farm.plan_report`.

>>> import farm
>>> report = farm.plan_report("job.zarr", farm.PlanOptions(tiles="auto"), n_workers=4)   # doctest: +SKIP
>>> print(report.table())                                                               # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from farm import config
from farm.decoders import DecoderSpec
from farm.errors import FarmError
from farm.media.settings import VideoSettings
from farm.planning import planner
from farm.planning.budgets import check_fits, host_peak_bytes, window_peak_bytes
from farm.planning.costmodel import CostModel
from farm.planning.jobplan import encoded_video, plan_job, predict_render, render_cost_model
from farm.planning.options import PlanOptions
from farm.planning.plan_table import describe_plans
from farm.planning.tiling import ShotPlan
from farm.run.cluster import cpu_count, io_workers_beside_gpus, local_decode_workers
from farm.store.job import Job, open_job


@dataclass(frozen=True)
class PlanReport:
    """A job's plans for `n_workers` decode and `n_io` I/O workers, and what the cost model predicts of
    them; `refusal` is the error of plans that cannot fit the cost model's GPU (then no prediction)."""

    plans: list[ShotPlan]
    spec: DecoderSpec
    model: CostModel
    n_workers: int
    n_io: int
    prediction: planner.Prediction | None
    window: int | None  # render's default window per worker on the cost model's GPU; None on CPU
    refusal: FarmError | None
    skipped: tuple[str, ...] = ()  # why each shot that cannot be planned is left out (every shot asked for)
    encodes: str | None = None  # what the predicted encodes are of (None: no video)

    def table(self) -> str:
        """The tile table (`farm.planning.plan_table.describe_plans`): it shows why a refusal refuses."""
        return describe_plans(self.plans, self.spec, self.n_workers)

    def summary(self) -> str:
        """The prediction's lines, the I/O workers it assumes and the default window's memory."""
        if self.prediction is None:
            return ""
        lines = [planner.describe(self.prediction, self.model)]
        if self.n_io:
            lines.append(f"  with {self.n_io} I/O worker(s) for writes and encodes, as a local GPU cluster "
                         "on this machine starts them (farm.io-workers)")  # fmt: skip
        if self.encodes:
            lines.append(f"  encodes: {self.encodes}")
        gpu_bytes = self.model.worker_memory_bytes
        if self.window and gpu_bytes:
            peak = window_peak_bytes(self.plans, self.spec, self.window)
            host = host_peak_bytes(self.plans, self.window, VideoSettings())
            lines.append(
                f"  render's default window on a {gpu_bytes / 2**30:.1f} GiB GPU (the cost model's, at most "
                "--gpu-memory): "
                f"{self.window} decoded tiles per worker, GPU memory per worker at most {peak / 2**30:.2f} "
                f"GiB, host memory for blended batches at most {host / 2**30:.2f} GiB"
            )
        return "\n".join(lines)


def plan_report(
    job_path: str | os.PathLike[str] | Job,
    options: PlanOptions | None = None,
    n_workers: int | None = None,
    shots: Sequence[str] | None = None,
    *,
    video: bool | VideoSettings = True,
) -> PlanReport:
    """Plan the job at `job_path` (or a `Job`, as `farm.plan` takes either) for `n_workers` decode workers
    (default: what ``farm render`` would start here: one per GPU, or up to 4 CPU processes), predicting a
    render that encodes videos unless `video` is false. `options`: default `PlanOptions()` (farm.*
    settings read now)."""
    options = options or PlanOptions()
    if n_workers is not None and n_workers < 1:
        raise FarmError(f"--workers {n_workers} is invalid; use 1 or more")
    n_workers = n_workers if n_workers is not None else local_decode_workers()
    job = job_path if isinstance(job_path, Job) else open_job(job_path)
    model = render_cost_model(job.spec, options, video)
    if options.worker_memory and model.worker_memory_bytes and not model.decode_on_host:
        # --gpu-memory: the plans, their check and the window are for the budget, not the model's GPU
        model = model.with_(worker_memory_bytes=min(model.worker_memory_bytes, options.worker_memory))
    n_io = planned_io_workers(model, n_workers)
    skipped: tuple[str, ...] = ()
    if shots is None:  # every shot: one whose metadata cannot be read is named and left out
        unreadable = {name: info.problem for name, info in job.shots.items() if info.problem is not None}
        if unreadable and len(unreadable) < len(job.shots):
            shots = [name for name in job.shots if name not in unreadable]
            skipped = tuple(str(problem) for problem in unreadable.values())
    plans = plan_job(job, options, n_workers, shots, n_io=n_io, video=video)
    try:
        check_fits(plans, job.spec, None if model.decode_on_host else model.worker_memory_bytes)
    except FarmError as refusal:
        return PlanReport(plans, job.spec, model, n_workers, n_io, None, None, refusal, skipped)
    prediction, window = predict_render(plans, job.spec, model, n_workers, n_io)
    encodes = describe_encodes(video, options, model)
    return PlanReport(plans, job.spec, model, n_workers, n_io, prediction, window, None, skipped, encodes)


def describe_encodes(video: bool | VideoSettings, options: PlanOptions, model: CostModel) -> str | None:
    """What a prediction's encodes are of: codec, preset and the frames' bits per pixel, and where those
    come from; None without video."""
    settings = encoded_video(video)
    if settings is None:
        return None
    codec = "h265 (HLG master)" if settings.hdr else settings.codec
    preset = "" if settings.codec.startswith("prores") else f" {settings.preset}"
    reference = model.encode_reference
    bits = options.encoded_bits_per_pixel
    if bits is not None:
        frames = f"frames written at {bits:.3g} bits per pixel (farm.encoded-bits-per-pixel)"
    else:
        frames = (f"frames like the cost model's ({reference.bits_per_pixel:.3g} bits per pixel at "
                  f"{reference.codec} {reference.preset}: {reference.frames}); `farm -v render` reports a "
                  "render's own, which farm.encoded-bits-per-pixel predicts with")  # fmt: skip
    return f"{codec}{preset} of {frames}"


def planned_io_workers(model: CostModel, n_workers: int) -> int:
    """The I/O workers a plan is predicted with: none for a CPU cost model, else farm.io-workers or
    what a local CUDA cluster of `n_workers` GPUs on this machine would start."""
    if model.decode_on_host:
        return 0
    chosen = config.get("io-workers")
    return int(chosen) if chosen is not None else io_workers_beside_gpus(n_workers, cpu_count())
