"""Decoder adapters over diffusers video VAEs, and the decoder spec stored in a job.

A decoder spec is a JSON object:

    {"family": "ltx2",                      # which adapter
     "config": "ltx2-tiny" | {...},          # a named config or the model's constructor arguments
     "weights": {"path": "/models/vae"} | {"random_seed": 0},
     "dtype": "bfloat16",                    # compute dtype: float32, bfloat16 or float16
     "latents": "denormalized"}              # or "normalized": farm applies the VAE's mean/std first

Adding a model: one module with a class implementing `VideoDecoder`, plus an entry in `FAMILIES`.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from farm.decoders.base import DecoderSpec, VideoDecoder, parse_spec
from farm.decoders.hunyuanvideo import HunyuanVideoDecoder
from farm.decoders.ltx2 import LTX2Decoder
from farm.decoders.ltxv import LTXVideoDecoder
from farm.decoders.wan import WanDecoder

FAMILIES: dict[str, type[VideoDecoder]] = {
    "ltx2": LTX2Decoder,
    "ltxv": LTXVideoDecoder,
    "wan": WanDecoder,
    "hunyuanvideo": HunyuanVideoDecoder,
}

_cache: dict[tuple[str, str, bool], VideoDecoder] = {}
_cache_lock = threading.Lock()


def decoder_class(spec: DecoderSpec) -> type[VideoDecoder]:
    return FAMILIES[spec.family]


def load_decoder(
    spec: DecoderSpec | dict[str, Any], device: str = "cpu", compile: bool = False
) -> VideoDecoder:
    """The decoder for `spec` on `device`, built once per process and reused across tiles and shots.

    `compile` wraps the decoder in `torch.compile` (CUDA only): each new tile shape compiles once per
    process; inductor's on-disk cache lets later workers and shots reuse the kernels.
    """
    if not isinstance(spec, DecoderSpec):
        spec = parse_spec(spec, families=FAMILIES)
    compile = compile and device.startswith("cuda")
    key = (json.dumps(spec.to_json(), sort_keys=True), device, compile)
    with _cache_lock:  # several task threads may ask at once: build once
        if key not in _cache:
            decoder = decoder_class(spec).load(spec, device)
            if compile:
                decoder.enable_compile()
            _cache[key] = decoder
    return _cache[key]


def spec_from_json(raw: dict[str, Any], where: str = "decoder spec") -> DecoderSpec:
    return parse_spec(raw, families=FAMILIES, where=where)


__all__ = ["FAMILIES", "DecoderSpec", "VideoDecoder", "load_decoder", "spec_from_json", "parse_spec"]
