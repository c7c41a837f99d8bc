"""Re-render some shots of a job into an existing render output, leaving its other shots as they are.

    farm submit workflows/rerender.py --scheduler-file F [--detach] -- JOB --out OUT --shots sh010,sh020 \\
        [--tiles auto] [--batch-frames 32] [--no-video]

The named shots start over (their frames, segments, video and done markers are discarded, then rendered
again with the options given, and OUT's recorded batch frames and output settings for those not given);
every other shot in OUT is untouched. Run directly, ``--workers N`` starts
a local cluster and ``--scheduler``/``--scheduler-file`` join one.

A whole shot is the unit: re-rendering only some frames of a finished shot is not offered, because
once a shot's video is joined its per-batch segments are removed, so a few new batches would need a
re-encode of the whole video. (``farm render --frames`` renders frame ranges not yet rendered.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from farm import workflow
from farm.errors import FarmError


def main(argv: Sequence[str]) -> int:
    from farm.media.settings import VideoSettings
    from farm.planning.options import PlanOptions, parse_tiles, parse_triple
    from farm.run.recorded import options_with, out_settings, taken_settings, video_with
    from farm.store.job import open_job
    from farm.store.output import Output

    p = argparse.ArgumentParser(prog="rerender.py", description="Re-render some shots of a job.")
    p.add_argument("job", help="job store")
    p.add_argument("--out", required=True, help="existing render output")
    p.add_argument("--shots", required=True, help="comma-separated shots to render again")
    p.add_argument("--tiles", default=None, help="auto or F,H,W (default: farm's default)")
    p.add_argument("--overlap", default=None, help="F,H,W in latent units")
    p.add_argument("--batch-frames", type=int, default=None,
                   help="pixel frames per batch (default: OUT's, else farm's default)")
    p.add_argument("--priority", type=int, default=None, help="priority (default: the submission's)")
    p.add_argument("--no-video", action="store_true", help="frames to Zarr only (default: as OUT)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--scheduler", help="when run directly: join this scheduler")
    g.add_argument("--scheduler-file", help="when run directly: join the cluster of this scheduler file")
    g.add_argument("--workers", type=int, help="when run directly: start a local cluster of N workers")
    args = p.parse_args(list(argv))

    shots = [s for s in args.shots.split(",") if s]
    job = open_job(args.job)
    missing = [s for s in shots if s not in job.shots]
    if missing:
        raise FarmError(f"shots {missing} are not in the job {args.job}; shots: {sorted(job.shots)}")
    options: dict = {}
    if args.tiles:
        options["tiles"] = parse_tiles(args.tiles)
    if args.overlap:
        options["overlap"] = parse_triple(args.overlap, "--overlap", minimum=0)
    if args.batch_frames:
        options["batch_frames"] = args.batch_frames
    cluster = {k: getattr(args, k) for k in ("scheduler", "scheduler_file", "workers") if getattr(args, k)}
    workflow.log(f"rerender: {len(shots)} shot(s) of {args.job} start over in {args.out}: {', '.join(shots)}")
    # what the other shots of OUT were rendered with, unless given here
    given = frozenset(option for option, value in (("--batch-frames", args.batch_frames),
                                                   ("--no-video", args.no_video)) if value)  # fmt: skip
    taken = taken_settings(out_settings(Output(Path(args.out)), list(job.shots)), given)
    stats = workflow.render(
        args.job, args.out, shots=shots, restart=True, options=options_with(PlanOptions(**options), taken),
        video=video_with(VideoSettings(enabled=not args.no_video), taken), priority=args.priority, **cluster,
    )  # fmt: skip
    for shot in stats.shots.values():
        workflow.log(f"  {shot.shot}: {shot.batches_written}/{shot.batches_total} batches"
                     + (f", FAILED: {shot.error}" if shot.error else ""))  # fmt: skip
    return 1 if stats.failed else 0


if __name__ == "__main__":
    sys.exit(workflow.run(main))
