"""Helpers shared by several test files (test files import from here, never from each other)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from farm.decoders.ltx2 import LTX2_TINY

if TYPE_CHECKING:
    from distributed import Client

    from farm.planning.tiling import ShotPlan


# A causal LTX-2 decoder at the tiny widths: diffusers' constructor default (`decoder_causal: true`), not a
# released model, and the one kind of decoder that carries its state between temporal chunks (--carry).
CAUSAL_LTX2_TINY = {"family": "ltx2", "config": {**LTX2_TINY, "decoder_causal": True}}


# ltx-core's `vae` config for farm's ltx2-tiny: the released LTX-2 decoder's blocks (a res_x mid block,
# then three residual spatio-temporal upsamplers halving the channels, each followed by res_x), not
# causal, reflect padding, no timestep conditioning; 4 base channels instead of 128.
LTX2_TINY_FILE_CONFIG = {
    "_class_name": "CausalVideoAutoencoder",
    "dims": 3,
    "latent_channels": 8,
    "decoder_blocks": [
        ["res_x", {"num_layers": 1, "inject_noise": False}],
        ["compress_all", {"residual": True, "multiplier": 2}],
        ["res_x", {"num_layers": 1, "inject_noise": False}],
        ["compress_all", {"residual": True, "multiplier": 2}],
        ["res_x", {"num_layers": 1, "inject_noise": False}],
        ["compress_all", {"residual": True, "multiplier": 2}],
        ["res_x", {"num_layers": 1, "inject_noise": False}],
    ],
    "norm_layer": "pixel_norm",
    "patch_size": 4,
    "causal_decoder": False,
    "timestep_conditioning": False,
    "spatial_padding_mode": "reflect",
    "decoder_base_channels": 4,
}


_LTXV_COMMON = {"_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3,
                "latent_channels": 8, "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4,
                "latent_log_var": "uniform", "use_quant_conv": False, "causal_decoder": False,
                "encoder_base_channels": 8, "decoder_base_channels": 8}  # fmt: skip
# 0.9.0's block list (encoder and decoder alike), one layer per block
_LTXV_090_BLOCKS = [["res_x", 1], ["compress_all", 1], ["res_x_y", 1], ["res_x", 1], ["compress_all", 1],
                    ["res_x_y", 1], ["res_x", 1], ["compress_all", 1], ["res_x", 1],
                    ["res_x", 1]]  # fmt: skip

# 0.9.5's encoder list, one layer per block
_LTXV_095_ENCODER = [["res_x", 1], ["compress_space_res", {"multiplier": 2}], ["res_x", 1],
                     ["compress_time_res", {"multiplier": 2}], ["res_x", 1],
                     ["compress_all_res", {"multiplier": 2}], ["res_x", 1],
                     ["compress_all_res", {"multiplier": 2}], ["res_x", 1]]  # fmt: skip


def _ltxv_decoder_blocks(inject_noise: bool) -> list:
    """0.9.1 / 0.9.5's decoder list (pixel side first): res_x groups between residual 2x2x2 upsamplers
    that halve the channels; 0.9.1 injects noise in all groups but the innermost."""
    blocks: list = []
    for i in range(4):
        blocks.append(["res_x", {"num_layers": 1, "inject_noise": inject_noise and i < 3}])
        if i < 3:
            blocks.append(["compress_all", {"residual": True, "multiplier": 2}])
    return blocks


# ltx-video's `vae` config (a single file's `config` metadata) for farm's tiny LTX-Video configs: the released
# block lists (0.9.0, 0.9.1, 0.9.5) with one layer per block, 8 base channels, 8 latent channels.
LTXV_TINY_FILE_CONFIGS = {
    "ltxv-tiny": {**_LTXV_COMMON, "blocks": _LTXV_090_BLOCKS},
    "ltxv-0.9.1-tiny": {**_LTXV_COMMON, "encoder_blocks": _LTXV_090_BLOCKS,
                        "decoder_blocks": _ltxv_decoder_blocks(True), "timestep_conditioning": True},
    "ltxv-0.9.5-tiny": {**_LTXV_COMMON, "encoder_blocks": _LTXV_095_ENCODER,
                        "decoder_blocks": _ltxv_decoder_blocks(False), "timestep_conditioning": True},
}  # fmt: skip


def pattern(n: int, start: int = 0, h: int = 64, w: int = 96) -> np.ndarray:
    """Smooth moving gradients in [30, 225] (no clipping, no sharp edges): near-lossless in H.264."""
    t = np.arange(start, start + n, dtype=np.float64)[:, None, None]
    y = np.arange(h, dtype=np.float64)[None, :, None] / h
    x = np.arange(w, dtype=np.float64)[None, None, :] / w
    r = 128 + 90 * np.sin(2 * np.pi * (x + t / 50))
    g = 128 + 90 * np.cos(2 * np.pi * (y + t / 70))
    b = 30 + 150 * (x + y) / 2 + 0.5 * t
    return np.stack(np.broadcast_arrays(r, g, b), axis=-1).round().astype(np.uint8)


def save_weights(model, tmp_path: Path, form: str) -> Path:
    """Save a diffusers VAE as a `save_pretrained` folder or one safetensors file; returns its path."""
    from safetensors.torch import save_file

    if form == "folder":
        model.save_pretrained(tmp_path / "vae")
        return tmp_path / "vae"
    path = tmp_path / "vae.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def assert_same_video(a: Path, b: Path) -> None:
    """Two videos of the same frames (encoded twice: small encoder-level differences allowed)."""
    from farm.media import video

    assert video.probe(a).frames == video.probe(b).frames
    va, vb = (video.read_frames(p).astype(np.int16) for p in (a, b))
    # same frames encoded twice: x264's threaded encodes differ a little, most on the noise-like frames of
    # random weights (1.3 levels on average at 64x64, where either encode is 27 levels from its frames);
    # frames out of order or from another batch differ by tens of levels
    assert np.abs(va - vb).mean() < 3.0


def chunk_files(out: Path) -> dict[str, bytes]:
    """Every chunk file of OUT's Zarr frames (every array of every shot: frames, valid mask, coordinates),
    by its path under OUT: what two renders of the same frames hold byte for byte."""
    chunks = [p for p in (out / "frames.zarr").rglob("*") if p.is_file() and "c" in p.relative_to(out).parts]
    return {str(p.relative_to(out)): p.read_bytes() for p in chunks}


def farm(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run the `farm` command in a child process (this interpreter), with `env` added to the environment."""
    return subprocess.run(
        [sys.executable, "-m", "farm", *args], capture_output=True, text=True, cwd=cwd, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def plans_required_window(plans: Sequence[ShotPlan]) -> int:
    """`farm.planning.schedule.required_window` of `plans` decoded whole (one decode step per tile)."""
    from farm.planning.schedule import make_schedule, required_window

    schedule = make_schedule(plans, n_decode=1, n_io=0, stream=False)
    return required_window(schedule.decodes, schedule.blends)


@contextlib.contextmanager
def workers_paused(client: Client):
    """Occupy every task thread of every worker until the block ends: renders stop progressing
    (deterministic 'mid-render' moments on a machine where tiny renders take a second or two)."""
    from distributed import Event, Queue

    from farm.run.cluster import workers_info

    def hold(name: str) -> None:  # nested: pickled by value (the workers cannot import this module)
        from distributed import Client, Event, Queue, get_worker

        with Client(get_worker().scheduler.address, set_as_default=False) as own:
            Queue(name + "-started", client=own).put(1)
            Event(name, client=own).wait(120)

    name = f"pause-{time.monotonic_ns()}"
    threads = [w for w, info in sorted(workers_info(client).items()) for _ in range(info["nthreads"])]
    event, started = Event(name, client=client), Queue(name + "-started", client=client)
    holds = [client.submit(hold, name, key=f"{name}-{i}", workers=[w], allow_other_workers=False,
                           priority=10**15, pure=False) for i, w in enumerate(threads)]  # fmt: skip
    for _ in threads:
        started.get(timeout=60)
    try:
        yield
    finally:
        event.set()
        client.gather(holds)


def levels(pixels) -> np.ndarray:
    """A decoder's output ``[3, F, H, W]`` in [-1, 1] (torch) → uint8 frames ``[F, H, W, 3]``, rounded as
    farm's render rounds them (`farm.worker.tasks.to_uint8_`)."""
    import torch

    unit = ((pixels.float() + 1.0) / 2.0).clamp(0.0, 1.0)
    return unit.mul(255.0).round().to(torch.uint8).permute(1, 2, 3, 0).numpy()


def psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two uint8 videos (inf when equal)."""
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return float("inf") if mse == 0 else 10.0 * float(np.log10(255.0**2 / mse))


def ingest_and_render(
    tmp_path: Path, latent: np.ndarray, decoder: dict, weights: Path, scheduler: str,
    grids: Sequence[tuple[tuple[int, int, int], tuple[int, int, int] | None]], latents: str = "normalized",
) -> list[np.ndarray]:  # fmt: skip
    """`farm ingest` of one latent file ``[C, F, H, W]`` with `decoder` (a spec without weights) and the
    weights file, then one `farm render` per (tiles, overlap) grid on the cluster at `scheduler`: the
    rendered uint8 frames ``[F, H, W, 3]`` of each, read back from the Zarr output."""
    from farm.inputs.ingest import ingest
    from farm.planning.options import PlanOptions
    from farm.run.render import render
    from farm.store.frames import read_frames
    from farm.store.output import Output

    np.save(tmp_path / "shot.npy", latent)
    job = tmp_path / "job.zarr"
    ingest(job, [tmp_path / "shot.npy"], decoder=decoder, weights=weights, latents=latents)
    frames = []
    for k, (tiles, overlap) in enumerate(grids):
        out = tmp_path / f"out{k}"
        stats = render(job, out, scheduler=scheduler, options=PlanOptions(tiles=tiles, overlap=overlap),
                       log=lambda _: None)  # fmt: skip
        assert not stats.failed
        frames.append(read_frames(Output(out), "shot"))
    return frames
