"""Write farm's stored cost models (farm/planning/costmodels/*.json): fit the decode part, record the rest.

* ``h200``: `ltx2` (the real LTX-2 VAE architecture, bf16) on one NVIDIA H200, from the measured figures
  in ../shared/FINDINGS.md and docs/performance.md ("Figures the recorded constants come from"; not
  re-measured here: this machine has no GPU).
* ``cpu``: `ltx2-tiny` (float32) on this machine, measured now: in-process decodes of a few latent
  shapes with one torch thread (as one worker of the local CPU cluster runs), a one-worker render for
  blend/write/encode and per-shot costs, and transfers between two local worker processes over TCP.

    python tools/fit_costmodel.py h200 --out farm/planning/costmodels/ltx2-h200.json
    python tools/fit_costmodel.py cpu --out farm/planning/costmodels/ltx2-tiny-cpu.json
    python tools/fit_costmodel.py decode --samples samples.json --out farm/planning/costmodels/ltx2-h200.json

* ``decode``: refit the decode part of the stored model at ``--out`` from decodes measured on its GPU
  (``benchmarks/reflect_pad.py --samples``: the model's sample shapes timed with farm's decoder),
  keeping everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.planning.costmodel import (  # noqa: E402
    CostModel,
    Link,
    Sample,
    fit_decode_cost,
    fit_report,
    relative_rms,
)

DATE = "2026-11-29"

# One NVIDIA H200, eager diffusers AutoencoderKLLTX2Video (default config), bf16, random weights:
# ../shared/FINDINGS.md "Decode cost" (latent F,H,W -> pixel F,H,W, seconds). These are diffusers' own
# decodes; the stored model's decode has since been refitted to farm's decoder (`decode` below), and its
# output figures by tools/refit_output_costs.py: `h200` rebuilds the first model, not today's.
H200_DECODES = [
    ((16, 22, 38), (121, 704, 1216), 0.493, "untiled 121x704x1216"),
    ((16, 11, 38), (121, 352, 1216), 0.246, "untiled 121x352x1216"),
    ((7, 22, 38), (49, 704, 1216), 0.205, "untiled 49x704x1216"),
    ((16, 13, 21), (121, 416, 672), 0.162, "2x2 grid tile, all 16 latent frames"),
    ((16, 13, 13), (121, 416, 416), 0.102, "2x4 grid tile, all 16 latent frames"),
    ((16, 7, 38), (121, 224, 1216), 0.159, "8 height strips tile, all 16 latent frames"),
    ((8, 22, 38), (57, 704, 1216), 0.236, "whole 22x38 frame, 8 latent frames"),
    ((4, 22, 38), (25, 704, 1216), 0.110, "whole 22x38 frame, 4 latent frames"),
    ((2, 22, 38), (9, 704, 1216), 0.047, "whole 22x38 frame, 2 latent frames"),
    ((16, 34, 60), (121, 1088, 1920), 1.21, "untiled 121x1088x1920"),
]


def h200_model() -> CostModel:
    samples = [Sample(px, s, lat, what) for lat, px, s, what in H200_DECODES]
    decode = fit_decode_cost(samples)
    pixels_8 = 8 * 121 * 704 * 1216  # benchmark_gpu.py on one H200, 2026-11-29: 8 shots, one worker, UCX
    return CostModel(
        name="ltx2-h200",
        decoder="ltx2",
        dtype="bfloat16",
        machine=(
            "one NVIDIA H200 (143771 MiB), driver 580, CUDA 13.0, 16 CPU cores; torch 2.11.0+cu130, "
            "diffusers 0.42.1 (eager), dask 2026.7.1, distributed-ucxx 0.52 (shared/FINDINGS.md, "
            "docs/performance.md)"
        ),
        date=DATE,
        decode=decode,
        task_overhead_s=0.005,
        blend_s_per_pixel=1.97 / pixels_8,
        write_s_per_pixel=11.90 / pixels_8,
        encode_s_per_pixel=17.30 / pixels_8,
        shot_overhead_s=(39.19 - 8 * 0.493 - (1.97 + 11.90 + 17.30)) / 8,
        threads_per_worker=8,
        output_streams_per_worker=2,
        output_streams_per_node=16,
        links={
            "ucx": Link(intra_node_bytes_per_s=1.0e11, inter_node_bytes_per_s=2.5e10, latency_s=0.0),
            "tcp": Link(intra_node_bytes_per_s=5.5e8, inter_node_bytes_per_s=5.5e8, latency_s=0.0),
        },
        protocol="ucx",
        workers_per_node=8,
        worker_memory_bytes=143771 * 2**20,
        samples=tuple(samples),
        notes=(
            "decode: non-negative least squares on relative error over the 10 measured decodes "
            f"(relative RMS error {relative_rms(decode, samples):.1%})",
            "blend_s_per_pixel: RenderStats.blend_s summed over 8 shots (one worker) / pixel-frames, "
            "charged per pixel-frame of every piece summed",
            "write_s_per_pixel, encode_s_per_pixel: Zarr write (write_s) and libx264 veryfast crf 18 encode "
            "(encode_s) per output pixel-frame, same render",
            "shot_overhead_s: run_graph time of the 8-shot render minus decodes and blend/write/encode, "
            "per shot (the one-shot render leaves the same 0.52 s)",
            "threads_per_worker 8: farm.run.cluster gives a GPU worker min(8, max(2, cores // GPUs)) task "
            "threads",
            "blend, write, encode and shot figures were measured before blends, writes and encodes became "
            "separate tasks on I/O threads (commit bf4e5c6); their per-pixel costs are assumed unchanged",
            "output_streams_per_worker 2: calibrated on the H200 renders after I/O moved off the decode path "
            "(benchmark_gpu.py on one H200, 2026-11-29, 1 worker, compiled decode: 1 shot 2.37 s, "
            "8 shots 13.06 s); 2 predicts "
            "2.96 s and 15.77 s (+25 %, +21 %), 3 predicts 2.34 s and 10.88 s: the conservative one is kept. "
            "One worker's writes and encodes are bound inside its process (one process's Zarr writes stop "
            "near 300 frames/s whatever the threads)",
            "output_streams_per_node 16: 8 workers x 2, assuming an 8-GPU node has the measured host's 16 "
            "cores per GPU, so the node adds no limit of its own",
            "task_overhead_s 0.005: assumed (Dask task round trip and a latent slice read), not measured",
            "links: ucx and tcp intra-node bandwidths measured (1 GiB in 10 ms / 1.9 s between two workers "
            "on the one GPU); inter-node figures are assumptions: 25 GB/s for UCX (200 Gb/s InfiniBand "
            "per GPU), TCP bound by its host copy as within a node; UCX's 0.25 s first-contact set-up "
            "between two workers is left out",
            "workers_per_node 8: an assumed 8-GPU node for farm-scale simulation (the measured host had "
            "one GPU)",
            "worker_memory_bytes: the H200's memory as torch reports it",
        ),
    )


# --------------------------------------------------------------------------------------------------
# CPU: ltx2-tiny measured here
# --------------------------------------------------------------------------------------------------

# Decodes of at least ~1.5 M output pixel-frames: below that the CPU runs a tiny decoder much faster per
# pixel (caches), and no tile farm plans on this machine is that small.
CPU_SHAPES = [
    (3, 8, 12), (3, 12, 8), (5, 8, 12), (5, 6, 16), (9, 8, 8), (3, 16, 16), (9, 8, 12), (5, 12, 20),
    (5, 16, 16), (9, 12, 12), (17, 8, 8),
]  # fmt: skip


def cpu_decodes(reps: int) -> list[Sample]:
    import numpy as np
    import torch

    from farm.decoders.ltx2 import LTX2Decoder
    from farm.inputs.synthetic import smooth_latent, synth_spec
    from farm.planning.costmodel import time_decodes

    torch.set_num_threads(1)
    spec = synth_spec("ltx2-tiny", seed=0)
    model = LTX2Decoder.build(spec)
    model.encoder = torch.nn.Identity()
    decoder = LTX2Decoder(spec, model, "cpu")
    rng = np.random.default_rng(0)
    latents = {fhw: torch.from_numpy(smooth_latent(rng, (8, *fhw))) for fhw in CPU_SHAPES}

    def decode(fhw):
        return tuple(decoder.decode(latents[fhw]).shape[1:])

    samples = time_decodes(decode, CPU_SHAPES, reps=reps)
    for s in samples:
        print(f"  decode latent {s.latent} -> pixels {s.pixels}: {s.seconds:.3f} s", flush=True)
    return samples


def cpu_render_costs(work: Path) -> dict[str, float]:
    """A one-worker render of 2 whole shots of 33x256x384 on a warm worker: write, encode, the rest."""
    from farm.inputs.synthetic import synth
    from farm.planning.options import PlanOptions
    from farm.run.render import render

    job = work / "job.zarr"
    synth(job, decoder="ltx2-tiny", shots=2, frames=33, height=256, width=384, overwrite=True)
    from farm.run.cluster import connect

    options = PlanOptions(tiles=(1, 1, 1), batch_frames=16)
    with connect(workers=1) as client:
        address = client.scheduler.address
        render(job, work / "warm", scheduler=address, options=options, log=lambda _: None)  # model load
        stats = render(job, work / "out", scheduler=address, options=options, log=lambda _: None)
    pixels = 2 * 33 * 256 * 384
    return {
        "seconds": stats.seconds,
        "write_s": stats.write_s,
        "encode_s": stats.encode_s,
        "pixels": pixels,
    }


def cpu_blend_seconds_per_pixel(reps: int = 5) -> float:
    """farm.worker.tasks.blend_batch on the CPU: two overlapping pieces of 16x256x384, one torch thread."""
    import numpy as np
    import torch

    from farm.planning.tiling import Batch
    from farm.worker.tasks import Placement, blend_batch

    torch.set_num_threads(1)
    batch = Batch("x", 0, 0, 16, (0, 1))
    pieces = [torch.rand(3, 16, 256, 384), torch.rand(3, 16, 256, 384)]
    places = [Placement(0, (0, 256), (0, 384)), Placement(0, (0, 256), (0, 384))]
    blend_batch(batch, (256, 384), places, pieces)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        blend_batch(batch, (256, 384), places, pieces)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / (2 * 16 * 256 * 384)


def cpu_transfers() -> dict[str, float]:
    """Seconds to move 8 MB and 128 MB numpy arrays between two local worker processes (TCP)."""
    import numpy as np
    from distributed import wait

    from farm.run.cluster import connect

    def make(n):
        return np.ones(n, dtype=np.uint8)

    def size(x):
        return x.nbytes

    out = {}
    with connect(workers=2) as client:
        a, b = sorted(client.scheduler_info(n_workers=-1)["workers"])
        client.submit(size, client.submit(make, 10, workers=[a], pure=False), workers=[b]).result()
        for n in (8 * 2**20, 128 * 2**20):
            times = []
            for _ in range(3):
                x = client.submit(make, n, workers=[a], pure=False)
                wait(x)
                t0 = time.perf_counter()
                client.submit(size, x, workers=[b], pure=False).result()
                times.append(time.perf_counter() - t0)
                del x
            out[str(n)] = min(times)
        t0 = time.perf_counter()
        for _ in range(20):
            client.submit(len, b"x", workers=[a], pure=False).result()
        out["task_round_trip_s"] = (time.perf_counter() - t0) / 20
    return out


def cpu_model(reps: int) -> CostModel:
    import torch

    print("decodes (one torch thread):", flush=True)
    samples = cpu_decodes(reps)
    decode = fit_decode_cost(samples)
    for s, p, e in fit_report(decode, samples):
        print(f"  fit {s.latent}: measured {s.seconds:.3f} s, model {p:.3f} s ({e:+.1%})")
    with tempfile.TemporaryDirectory(prefix="farm-costs-") as tmp:
        print("one-worker render:", flush=True)
        render = cpu_render_costs(Path(tmp))
        print(f"  {render}", flush=True)
    print("transfers between two workers (TCP):", flush=True)
    moves = cpu_transfers()
    print(f"  {moves}", flush=True)
    small, big = 8 * 2**20, 128 * 2**20
    bandwidth = (big - small) / max(moves[str(big)] - moves[str(small)], 1e-9)
    latency = max(0.0, moves[str(small)] - small / bandwidth)
    blend_px = cpu_blend_seconds_per_pixel()
    print(f"  blend: {blend_px:.3g} s per piece pixel-frame", flush=True)
    decodes = sum(decode.seconds((33, 256, 384)) for _ in range(2))
    blends = blend_px * render["pixels"]
    rest = render["seconds"] - decodes - blends - render["write_s"] - render["encode_s"]
    cpus = os.cpu_count() or 1
    return CostModel(
        name="ltx2-tiny-cpu",
        decoder="ltx2-tiny",
        dtype="float32",
        machine=(
            f"{platform.machine()} CPU, {cpus} cores, no GPU; Python {platform.python_version()}, torch "
            f"{torch.__version__}; local Dask cluster (TCP), one torch thread per decode"
        ),
        date=DATE,
        decode=decode,
        task_overhead_s=moves["task_round_trip_s"],
        blend_s_per_pixel=blend_px,
        write_s_per_pixel=render["write_s"] / render["pixels"],
        encode_s_per_pixel=render["encode_s"] / render["pixels"],
        shot_overhead_s=max(0.0, rest / 2),
        threads_per_worker=1,
        output_streams_per_worker=1,
        output_streams_per_node=1,
        decode_on_host=True,
        links={
            "tcp": Link(intra_node_bytes_per_s=bandwidth, inter_node_bytes_per_s=bandwidth, latency_s=latency)
        },  # fmt: skip
        protocol="tcp",
        workers_per_node=cpus,
        worker_memory_bytes=None,
        samples=tuple(samples),
        notes=(
            f"decode: {len(samples)} in-process decodes of smooth random latents, median of {reps} after a "
            f"warm-up, one torch thread; non-negative least squares on relative error "
            f"(relative RMS error {relative_rms(decode, samples):.1%})",
            "write/encode: RenderStats of a one-worker render of 2 whole shots of 33x256x384, batches of "
            f"16 frames ({render['seconds']:.2f} s in all)",
            "blend: farm.worker.tasks.blend_batch of two pieces of 16x256x384 in process, one torch thread",
            "shot_overhead_s: that render's time minus modelled decodes and blend/write/encode, per shot",
            "links: a numpy array moved between two local worker processes "
            f"(8 MiB {moves[str(small)]:.3f} s, 128 MiB {moves[str(big)]:.3f} s)",
            "task_overhead_s: mean round trip of a trivial pinned task from the client",
            "output_streams_per_node 1: the one-worker render's encodes already used every core (libx264 "
            "threads), so two workers' writes and encodes queue for the same cores",
            "decode_on_host: decodes run on the same cores as writes and encodes, so they queue for the "
            "node's one stream too",
            "worker_memory_bytes: none recorded (host memory per worker is whatever the cluster gives)",
        ),
    )


def refit_decode(path: Path, samples_json: Path) -> CostModel:
    """The stored model at `path` with its decode refitted to the ``slices`` seconds (farm's decoder, as
    its workers run it) of `samples_json`."""
    model = CostModel.from_json(json.loads(path.read_text()))
    measured = json.loads(samples_json.read_text())
    samples = [Sample(tuple(m["pixels"]), round(m["slices"], 4), tuple(m["latent"]), m["what"])
               for m in measured]  # fmt: skip
    decode = fit_decode_cost(samples)
    rms = relative_rms(decode, samples)
    ratio = sum(m["F.pad"] for m in measured) / sum(m["slices"] for m in measured)
    note = (f"decode: non-negative least squares on relative error over the {len(samples)} decodes of farm's "
            f"decoder (reflect padding by slices), measured {time.strftime('%Y-%m-%d')} with "
            f"benchmarks/reflect_pad.py --samples (relative RMS error {rms:.1%}); diffusers' own "
            f"decode (F.pad) took {ratio:.2f}x as long over the same samples")  # fmt: skip
    notes = (note, *(n for n in model.notes if not n.startswith("decode:")))
    return model.with_(decode=decode, samples=tuple(samples), notes=notes, date=time.strftime("%Y-%m-%d"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("which", choices=["h200", "cpu", "decode"])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--samples", type=Path, help="decode: the measured samples (JSON)")
    args = parser.parse_args(argv)
    if args.which == "decode":
        model = refit_decode(Path(args.out), args.samples)
    else:
        model = h200_model() if args.which == "h200" else cpu_model(args.reps)
    for s, p, e in fit_report(model.decode, model.samples):
        print(f"{str(s.pixels):<20} measured {s.seconds:.4f} s  model {p:.4f} s  {e:+.1%}")
    print(f"coefficients: {model.decode.coefficients}")
    Path(args.out).write_text(json.dumps(model.to_json(), indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
