"""What the CPU side of a render can sustain: H.264 encode and Zarr write rates, per process and in pools.

Frames come from the real LTX-2 decoder architecture with random weights (what the GPU benchmark renders:
colour noise, the hardest case for x264) and from a smooth synthetic clip (closer to natural video).
Each measurement encodes or writes batches of ``--batch`` frames, the unit a farm I/O task handles:

- ``swscale``: rgb24 → yuv420p (BT.709, tv range) per frame, one thread, as ``media.video.encode_segment``;
- ``encode``: ``encode_segment`` of one batch in one process (x264 picks its own thread count);
- ``encode-yuv``: the same, fed yuv420p planes made beforehand (what a GPU colour conversion would give);
- ``pool``: P processes encoding / writing / doing both for ``--jobs`` batches: aggregate frames/s;
- ``gpu-yuv``: RGB→YUV 4:2:0 on the GPU plus the device→host copy, per batch.

python benchmarks/profile_io.py --out-json $OUT/io.json --out-md $OUT/io.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np


def ltx2_frames(n: int, h: int, w: int) -> np.ndarray:
    import torch

    from farm.decoders import load_decoder
    from farm.inputs.synthetic import synth_spec

    spec = synth_spec("ltx2")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    decoder = load_decoder(spec.to_json(), device)
    g = decoder.geometry
    f = (n - 1) // g.temporal_scale + 1
    z = torch.randn((decoder.latent_channels, f, h // g.spatial_scale, w // g.spatial_scale),
                    generator=torch.Generator().manual_seed(0))  # fmt: skip
    with torch.inference_mode():
        pixels = decoder.decode(z, origin=(0, 0, 0))  # [3, F, H, W] in [0, 1]
    frames = torch.round(pixels.float().clamp(0, 1) * 255).to(torch.uint8).permute(1, 2, 3, 0)
    return frames.contiguous().cpu().numpy()


def smooth_frames(n: int, h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    out = np.empty((n, h, w, 3), np.uint8)
    for k in range(n):
        r = 127 + 120 * np.sin((x + 3 * k) / 90.0)
        g = 127 + 120 * np.cos((y - 2 * k) / 70.0)
        b = 127 + 120 * np.sin((x + y + 5 * k) / 150.0)
        out[k] = np.stack([r, g, b], -1).astype(np.uint8)
    return out


def yuv_planes(frames: np.ndarray, device: str = "cpu") -> Any:
    """uint8 RGB ``[F, H, W, 3]`` → yuv420p planes ``[F, H*3/2, W]`` by farm's conversion (farm.media.yuv)."""
    import torch

    from farm.media.yuv import rgb_to_yuv420

    pixels = torch.from_numpy(np.ascontiguousarray(frames)).to(device).permute(3, 0, 1, 2).float() / 255.0
    return rgb_to_yuv420(pixels)


# ---- pool jobs (module level so spawned processes can import them) ---------------------------------


def _load(path: str) -> np.ndarray:
    return np.load(path, mmap_mode="r")


def job_encode(frames_path: str, start: int, n: int, preset: str, out_dir: str, tag: str) -> float:
    from farm.media.video import encode_segment

    frames = np.ascontiguousarray(_load(frames_path)[start : start + n])
    t0 = time.perf_counter()
    encode_segment(frames, os.path.join(out_dir, f"{tag}-{start}-{os.getpid()}.mp4"), 24, preset=preset)
    return time.perf_counter() - t0


def job_encode_yuv(planes_path: str, start: int, n: int, preset: str, out_dir: str, tag: str) -> float:
    from farm.media.video import encode_segment

    planes = np.ascontiguousarray(_load(planes_path)[start : start + n])
    t0 = time.perf_counter()
    path = os.path.join(out_dir, f"{tag}-{start}-{os.getpid()}.mp4")
    encode_segment(None, path, 24, preset=preset, yuv420=planes)
    return time.perf_counter() - t0


def job_write(frames_path: str, start: int, n: int, zarr_path: str, k: int) -> float:
    import zarr

    frames = np.ascontiguousarray(_load(frames_path)[start : start + n])
    t0 = time.perf_counter()
    z = zarr.open_array(zarr_path, mode="r+")
    z[k * n : (k + 1) * n] = frames
    return time.perf_counter() - t0


def job_both(
    frames_path: str, start: int, n: int, preset: str, out_dir: str, zarr_path: str, k: int
) -> float:
    t0 = time.perf_counter()
    job_write(frames_path, start, n, zarr_path, k)
    job_encode(frames_path, start, n, preset, out_dir, "both")
    return time.perf_counter() - t0


def pool_rate(procs: int, fn: Any, arg_list: list[tuple], frames: int) -> float:
    import multiprocessing as mp

    with ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as pool:
        list(pool.map(_warm, range(procs)))  # processes started and imports done before timing
        t0 = time.perf_counter()
        list(pool.map(fn, *zip(*arg_list, strict=True)))
        dt = time.perf_counter() - t0
    return frames / dt


def _warm(_: int) -> int:
    import av  # noqa: F401
    import zarr  # noqa: F401

    import farm.media.video  # noqa: F401

    time.sleep(0.2)
    return os.getpid()


def make_zarr(path: str, n: int, shape: tuple[int, ...]) -> None:
    import zarr
    from zarr.codecs import ZstdCodec

    shutil.rmtree(path, ignore_errors=True)
    zarr.create_array(path, shape=(n, *shape), chunks=(8, *shape), dtype="uint8",
                      compressors=[ZstdCodec(level=1)])  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=121)
    p.add_argument("--height", type=int, default=704)
    p.add_argument("--width", type=int, default=1216)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--jobs", type=int, default=24, help="batches per pool measurement")
    p.add_argument("--procs", default="1,4,8,12")
    p.add_argument("--presets", default="ultrafast,superfast,veryfast")
    p.add_argument("--kinds", default="ltx2,smooth")
    p.add_argument("--work", default=None)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    args = p.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="farm-io-"))
    work.mkdir(parents=True, exist_ok=True)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
    results: dict[str, Any] = {"cpu_count": os.cpu_count(), "rows": []}
    rows = results["rows"]
    lines = ["| frames | what | preset | processes | frames/s |", "| --- | --- | --- | --- | --- |"]

    def row(kind: str, what: str, preset: str, procs: int, fps: float) -> None:
        rows.append({"kind": kind, "what": what, "preset": preset, "procs": procs, "fps": fps})
        lines.append(f"| {kind} | {what} | {preset} | {procs} | {fps:.0f} |")
        print(lines[-1], flush=True)

    b = args.batch
    presets = args.presets.split(",")
    procs_list = [int(x) for x in args.procs.split(",")]
    for kind in args.kinds.split(","):
        t0 = time.perf_counter()
        frames = (ltx2_frames if kind == "ltx2" else smooth_frames)(args.frames, args.height, args.width)
        print(f"{kind}: {frames.shape} made in {time.perf_counter() - t0:.1f} s", flush=True)
        fpath = str(shm / f"farm-{kind}.npy")
        np.save(fpath, frames)
        planes = yuv_planes(frames).numpy()
        ypath = str(shm / f"farm-{kind}-yuv.npy")
        np.save(ypath, planes)
        starts = [(k * b) % (args.frames - b) for k in range(args.jobs)]

        import av
        from av.video.reformatter import ColorRange, Colorspace

        t0 = time.perf_counter()
        for k in range(b):
            av.VideoFrame.from_ndarray(frames[k], format="rgb24").reformat(
                format="yuv420p", dst_colorspace=Colorspace.ITU709, dst_color_range=ColorRange.MPEG
            )
        row(kind, "swscale rgb24→yuv420p", "-", 1, b / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        yuv_planes(frames[:b])
        row(kind, "farm.media.yuv rgb→yuv420p on the CPU (torch)", "-", 1, b / (time.perf_counter() - t0))
        for preset in presets:
            dt = job_encode(fpath, 0, b, preset, str(work), "one")
            row(kind, "encode rgb24 (one segment)", preset, 1, b / dt)
            dt = job_encode_yuv(ypath, 0, b, preset, str(work), "oney")
            row(kind, "encode yuv420p (one segment)", preset, 1, b / dt)
        size = os.path.getsize(next(work.glob("one-0-*.mp4")))
        results.setdefault("segment_bytes", {})[kind] = size
        for procs in procs_list:
            zpath = str(work / f"z-{kind}-{procs}.zarr")
            make_zarr(zpath, args.jobs * b, frames.shape[1:])
            fps = pool_rate(
                procs, job_write, [(fpath, s, b, zpath, k) for k, s in enumerate(starts)], args.jobs * b
            )
            row(kind, "zarr write (zstd-1)", "-", procs, fps)
            for preset in presets:
                fps = pool_rate(procs, job_encode, [(fpath, s, b, preset, str(work), "p") for s in starts],
                                args.jobs * b)  # fmt: skip
                row(kind, "encode rgb24", preset, procs, fps)
                jobs = [(ypath, s, b, preset, str(work), "py") for s in starts]
                fps = pool_rate(procs, job_encode_yuv, jobs, args.jobs * b)
                row(kind, "encode yuv420p", preset, procs, fps)
            make_zarr(zpath, args.jobs * b, frames.shape[1:])
            fps = pool_rate(procs, job_both, [(fpath, s, b, "veryfast", str(work), zpath, k)
                                              for k, s in enumerate(starts)], args.jobs * b)  # fmt: skip
            row(kind, "zarr write + encode rgb24", "veryfast", procs, fps)
            shutil.rmtree(zpath, ignore_errors=True)
        for f in work.glob("*.mp4"):
            f.unlink()
        if kind == "ltx2":
            gpu_yuv(frames, b, row)
        os.unlink(fpath)
        os.unlink(ypath)
    Path(args.out_json).write_text(json.dumps(results, indent=1))
    Path(args.out_md).write_text("\n".join(lines) + "\n")


def gpu_yuv(frames: np.ndarray, b: int, row: Any) -> None:
    """farm.media.yuv on the GPU from a float batch (as a blend holds it), and the pinned device→host copy."""
    import torch

    from farm.media.yuv import rgb_to_yuv420

    if not torch.cuda.is_available():
        return
    x = torch.from_numpy(frames[:b]).cuda().permute(3, 0, 1, 2).float() / 255  # [3, F, H, W] as a blend has
    host = torch.empty((b, x.shape[2] * 3 // 2, x.shape[3]), dtype=torch.uint8, pin_memory=True)
    for rep in range(4):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        host.copy_(rgb_to_yuv420(x))
        torch.cuda.synchronize()
        if rep == 3:
            row("ltx2", "GPU rgb→yuv420 + pinned D2H", "-", 1, b / (time.perf_counter() - t0))


if __name__ == "__main__":
    main()
