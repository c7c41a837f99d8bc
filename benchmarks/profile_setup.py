"""What a render pays before its first decode starts: planning, latent hashes and output arrays.

Runs the set-up steps of ``farm.run.render.render`` one by one, with no cluster and no decode, on a
synthetic job of ``--shots`` LTX-2 latents (real latent shape for ``--frames x --height x --width``):

- ``plan``: ``plan_shots`` (every shot planned for one worker, to validate the job before a cluster);
- ``hash``: ``render_identities`` (each latent read, checked finite and hashed, shots on threads), and
  the same shots hashed one after another for comparison;
- ``output``: ``prepare_output`` and ``record_identity`` (Zarr groups, arrays and attributes).

python benchmarks/profile_setup.py --shots 8 --shots 64
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def seconds(fn, repeats: int) -> float:
    """Best of `repeats` calls."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def profile(work: Path, shots: int, frames: int, height: int, width: int, repeats: int) -> dict[str, float]:
    from farm.inputs.synthetic import synth
    from farm.media.settings import VideoSettings
    from farm.planning.jobplan import plan_shots
    from farm.planning.options import PlanOptions
    from farm.run.resume import record_identity, render_identities, render_identity
    from farm.store.frames import prepare_output
    from farm.store.output import Output

    job = synth(work / f"job-{shots}.zarr", decoder="ltx2", shots=shots, frames=frames, height=height,
                width=width, overwrite=True)  # fmt: skip
    options, video = PlanOptions(), VideoSettings()
    plans, errors = plan_shots(job, options)
    assert not errors, errors
    identities, _ = render_identities(job, plans, video)
    outputs = iter(range(10**6))

    def output() -> None:
        out = Output(work / f"out-{next(outputs)}", video.suffix)
        prepare_output(out, job, [(p.shot, p.pixel_shape, options.batch_frames) for p in plans])
        for p in plans:
            record_identity(out, p.shot, identities[p.shot], len(p.batches))

    return {
        "plan": seconds(lambda: plan_shots(job, options), repeats),
        "hash (threads)": seconds(lambda: render_identities(job, plans, video), repeats),
        "hash (one by one)": seconds(lambda: [render_identity(job, p, video) for p in plans], repeats),
        "output": seconds(output, repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shots", type=int, action="append", help="job sizes (repeatable; default 8)")
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--height", type=int, default=704)
    parser.add_argument("--width", type=int, default=1216)
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs per step")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="farm-setup-"))
    try:
        print(f"| shots | {args.frames}x{args.height}x{args.width} | plan s | hash s (threads) "
              "| hash s (one by one) | output s |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- |")
        for n in args.shots or [8]:
            r = profile(work, n, args.frames, args.height, args.width, args.repeats)
            print(f"| {n} | | {r['plan']:.3f} | {r['hash (threads)']:.3f} | {r['hash (one by one)']:.3f} "
                  f"| {r['output']:.3f} |")  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
