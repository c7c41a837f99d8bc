"""What an encode costs against what it encodes: seconds per pixel-frame of farm's segment encodes
(`farm.media.video.encode_segment`, as farm's I/O workers call it) for each codec and preset, on frames of
different complexity, beside the bits per pixel each encode wrote.

The frames: colour noise (as a decoder with random weights decodes), a smooth moving gradient (a clip with
little detail) and blurred noise between them. Every encode runs with one encoder thread and is timed in
this process's CPU seconds (the best of --reps), so the figures are one core's work whatever else the
machine runs. Prints a table; writes the rows as JSON and, with --rates-json, the rate of each codec and
preset fitted as ``fixed + per_bit * bits_per_pixel`` (`farm.planning.encode_cost`), which is how
``farm/planning/encode_rates.json`` is made:

    python benchmarks/measure_encode_cost.py --out-json enc.json --rates-json farm/planning/encode_rates.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.media.video import encode_segment  # noqa: E402

ENCODES = [
    ("h264", "ultrafast"),
    ("h264", "superfast"),
    ("h264", "veryfast"),
    ("h264", "faster"),
    ("h264", "fast"),
    ("h264", "medium"),
    ("h265", "ultrafast"),
    ("h265", "veryfast"),
    ("h265", "medium"),
    ("prores_hq", None),
    ("prores_4444", None),
]


def clips(frames: int, height: int, width: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (frames, height, width, 3), dtype=np.uint8)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    smooth = np.stack(
        [
            np.stack(
                [(x / width * 200 + 8 * t) % 256, y / height * 200, (x + y) / (width + height) * 255], axis=-1
            )
            for t in range(frames)
        ]
    ).astype(np.uint8)
    # noise blurred by a box of 8 pixels: detail between the two
    f = noise.astype(np.float32)
    for axis in (1, 2):
        f = sum(np.roll(f, k, axis=axis) for k in range(8)) / 8
    return {"noise": noise, "blurred noise": f.astype(np.uint8), "smooth": smooth}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--height", type=int, default=352)
    parser.add_argument("--width", type=int, default=608)
    parser.add_argument("--reps", type=int, default=3, help="best of this many encodes")
    parser.add_argument("--out-json", type=Path, default=None)
    parser.add_argument("--rates-json", type=Path, default=None, help="write the fitted rates here")
    args = parser.parse_args()
    pixels = args.frames * args.height * args.width
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for content, frames in clips(args.frames, args.height, args.width).items():
            for codec, preset in ENCODES:
                path = Path(tmp) / f"seg.{'mov' if codec.startswith('prores') else 'mp4'}"
                best = float("inf")
                for _ in range(args.reps):
                    started = time.process_time()  # CPU seconds: one thread, whatever else runs
                    encode_segment(frames, path, 24, codec=codec, preset=preset or "veryfast", threads=1)
                    best = min(best, time.process_time() - started)
                    size = os.path.getsize(path)
                    path.unlink()
                rows.append(
                    {
                        "content": content,
                        "codec": codec,
                        "preset": preset,
                        "s_per_pixel": best / pixels,
                        "bits_per_pixel": size * 8 / pixels,
                    }
                )
                print(
                    f"{content:14s} {codec:12s} {preset or '-':10s} {best / pixels * 1e9:8.2f} ns/pixel "
                    f"{size * 8 / pixels:7.3f} bits/pixel",
                    flush=True,
                )
    record = {
        "date": date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "frames": [args.frames, args.height, args.width],
        "rows": rows,
    }
    if args.out_json:
        args.out_json.write_text(json.dumps(record, indent=1))
    if args.rates_json:
        args.rates_json.write_text(json.dumps(fitted_rates(record), indent=1) + "\n")


def fitted_rates(record: dict) -> dict:
    """Per codec and preset, ``fixed`` and ``per_bit`` fitted over the kinds of frames, with the fit's
    worst relative error and where the rows came from."""
    from farm.planning.encode_cost import fit_rate, rate_key

    by_key: dict[str, list[tuple[float, float]]] = {}
    for row in record["rows"]:
        by_key.setdefault(rate_key(row["codec"], row["preset"]), []).append(
            (row["bits_per_pixel"], row["s_per_pixel"])
        )
    rates = {}
    for key, samples in by_key.items():
        rate = fit_rate(samples)
        worst = max(abs(rate.seconds_per_pixel(bits) / s - 1) for bits, s in samples)
        rates[key] = {"fixed": rate.fixed, "per_bit": rate.per_bit, "worst_relative_error": round(worst, 3)}
    frames = "x".join(map(str, record["frames"]))
    source = (
        f"benchmarks/measure_encode_cost.py on {record['machine']}, {record['date']}: one encoder thread, "
        f"CPU seconds, {frames} frames of noise, blurred noise and a smooth clip"
    )
    return {"source": source, "rates": rates, "rows": record["rows"]}


if __name__ == "__main__":
    main()
