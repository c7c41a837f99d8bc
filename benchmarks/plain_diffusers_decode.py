"""The baseline farm is measured against: what a user writes to decode latents with diffusers alone.

One fresh process: import torch and diffusers, load the VAE from a local folder onto the GPU in bf16
(``--device cpu --dtype float32`` for a check on a CPU), decode each latent (``.npy`` files, [C, F, H, W],
as the pipeline hands them to ``vae.decode``), and write each as an H.264 mp4 with PyAV (crf 18,
veryfast: farm's default settings). Prints one JSON line with the seconds of each step.

    python benchmarks/plain_diffusers_decode.py --vae /models/ltx2-vae --out /tmp/plain LATENT.npy ...
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

STARTED = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("latents", nargs="+", help=".npy latents [C, F, H, W]")
    parser.add_argument("--vae", required=True, help="diffusers folder of the video VAE")
    parser.add_argument("--model", default="AutoencoderKLLTX2Video", help="diffusers class")
    parser.add_argument("--out", required=True, help="folder for the mp4 files")
    parser.add_argument("--fps", type=float, default=24.0)
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a check on a machine without one")
    parser.add_argument("--dtype", default="bfloat16", help="torch dtype of the weights and the decode")
    args = parser.parse_args()

    import av
    import diffusers
    import numpy as np
    import torch

    steps: dict[str, float] = {}
    mark = time.perf_counter()
    steps["imports"] = mark - STARTED
    dtype = getattr(torch, args.dtype)
    vae = getattr(diffusers, args.model).from_pretrained(args.vae, torch_dtype=dtype).to(args.device)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    steps["load"] = time.perf_counter() - mark
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    decode_s = write_s = 0.0
    for path in args.latents:
        t = time.perf_counter()
        latent = torch.from_numpy(np.load(path)).to(args.device, dtype)[None]
        with torch.inference_mode():
            video = vae.decode(latent, return_dict=False)[0][0]  # [3, F, H, W] in [-1, 1]
        frames = ((video.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).cpu()
        decode_s += time.perf_counter() - t
        t = time.perf_counter()
        with av.open(str(out / (Path(path).stem + ".mp4")), mode="w") as container:
            stream = container.add_stream(
                "libx264", rate=int(args.fps), options={"crf": "18", "preset": "veryfast"}
            )
            stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
            for frame in frames.numpy():
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(stream.encode())
        write_s += time.perf_counter() - t
    steps["decode"] = decode_s
    steps["write mp4"] = write_s
    steps["wall in process"] = time.perf_counter() - STARTED
    print(json.dumps(steps))


if __name__ == "__main__":
    main()
