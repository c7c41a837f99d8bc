"""Decoder adapters over diffusers video VAEs, and the decoder spec stored in a job.

A decoder spec is a JSON object:

    {"family": "ltx2",                      # which adapter
     "config": "ltx2-tiny" | {...},          # a named config or the model's constructor arguments
     "weights": {"path": "/models/vae"} | {"random_seed": 0},   # + "files", "layout", "identity" once checked
     "dtype": "bfloat16",                    # compute dtype: float32, bfloat16 or float16
     "latents": "denormalized",              # or "normalized": farm applies the VAE's mean/std first
     "hdr": "logc3"}                         # optional, HDR latents: the decoded values are "acescct" or
                                             # "logc3" codes (farm.media.hdr); needs dtype float32

Adding a model: a folder, `farm/decoders/<family>/`, whose adapter derives from
`farm.decoders.diffusers_vae.DiffusersVideoDecoder` (every hook declared there with its default), plus
one entry in `FAMILIES` (docs/decoders.md "Adding a model"). The specs users give (a named config, JSON
text or file) are read by `farm.decoders.user_spec`, for video and sound decoders alike.

The driver plans from what the adapters say of a spec (`geometry`, `memory` terms, weights checks,
recorded constructor defaults), and workers decode with them: every module here imports torch and
diffusers only inside the functions that decode. May import: `farm.errors`, `farm.config`, numpy.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from farm import config
from farm.decoders.allegro import AllegroDecoder
from farm.decoders.any_diffusers import AnyDiffusersDecoder
from farm.decoders.base import DecoderSpec, VideoDecoder, parse_spec
from farm.decoders.checkpoints import content_identity, weight_files
from farm.decoders.cogvideox import CogVideoXDecoder
from farm.decoders.cosmos import CosmosDecoder
from farm.decoders.hunyuanvideo import HunyuanVideoDecoder
from farm.decoders.hunyuanvideo15 import HunyuanVideo15Decoder
from farm.decoders.ltx2 import LTX2Decoder
from farm.decoders.ltx2_diffusion import LTX2DiffusionDecoder
from farm.decoders.ltxv import LTXVideoDecoder
from farm.decoders.memory import MemoryModel
from farm.decoders.minimax_h3 import MiniMaxH3Decoder
from farm.decoders.mochi import MochiDecoder
from farm.decoders.vidtok import VidTokDecoder
from farm.decoders.wan import WanDecoder
from farm.decoders.weights import check_pinned
from farm.errors import FarmError

FAMILIES: dict[str, type[VideoDecoder]] = {
    "ltx2": LTX2Decoder,
    "ltxv": LTXVideoDecoder,
    "wan": WanDecoder,
    "hunyuanvideo": HunyuanVideoDecoder,
    "ltx2-diffusion": LTX2DiffusionDecoder,
    "minimax-h3": MiniMaxH3Decoder,
    "diffusers": AnyDiffusersDecoder,
    "cogvideox": CogVideoXDecoder,
    "mochi": MochiDecoder,
    "hunyuanvideo15": HunyuanVideo15Decoder,
    "cosmos": CosmosDecoder,
    "allegro": AllegroDecoder,
    "vidtok": VidTokDecoder,
}

CacheKey = tuple[str, str, str | None]  # (spec with the weights' content identity, device, compile mode)
_cache: dict[CacheKey, VideoDecoder] = {}
_cache_lock = threading.Lock()
_asked: set[CacheKey] = set()  # the decoders tasks of this process asked for (`load_decoder`)
# Decoders the worker's warm-up built from a render's hint (`preload_decoder`), by cache key: their name
# on the device, and "waiting" (no task asked for one yet), "taken" or "dropped" (`preloads`).
_preloads: dict[CacheKey, list[str]] = {}
# What loading and compiling cost in this process (`decoder_timings`): seconds to build each decoder,
# and each decoder's first call per latent shape (a compiled one's compilation, or inductor's cache,
# included), keyed by mode ("eager" or the compile mode) and shape.
_timings: dict[str, dict[str, float]] = {"load_s": {}, "first_call_s": {}}


def memory_model(spec: DecoderSpec) -> MemoryModel:
    """The planner's model of a decode call's peak memory for `spec`: its adapter's memory terms (what
    its ``peak_bytes`` computes, HunyuanVideo's attention mask included)."""
    return MemoryModel.from_terms(decoder_class(spec).memory_terms(spec))


def decoder_class(spec: DecoderSpec) -> type[VideoDecoder]:
    return FAMILIES[spec.family].for_spec(spec)


def load_decoder(
    spec: DecoderSpec | dict[str, Any], device: str = "cpu", compile: bool | str = False
) -> VideoDecoder:
    """The decoder for `spec` on `device`, built once per process and reused across tiles and shots.

    `compile` wraps the decoder in `torch.compile` (CUDA only): True for torch's default mode, or a
    mode name from :data:`COMPILE_MODES`. Each new tile shape compiles once per process; inductor's
    on-disk cache lets later workers and shots reuse the kernels. A decoder the worker's warm-up
    preloaded (`preload_decoder`) is taken when it is this one, and dropped when it is not.
    """
    spec, key = _keyed(spec, device, compile)
    with _cache_lock:  # several task threads may ask at once: build once
        _asked.add(key)
        for other, entry in _preloads.items():
            if entry[1] == "waiting":
                entry[1] = "taken" if other == key else "dropped"
                if other != key:  # the hint did not match this process's tasks: its memory is given back
                    _cache.pop(other, None)
        return _built(spec, key)


def preload_decoder(
    spec: DecoderSpec | dict[str, Any], device: str = "cpu", compile: bool | str = False, *,
    on_built: Callable[[], None] | None = None,
) -> bool:  # fmt: skip
    """Build the decoder `load_decoder` would for the same arguments, ahead of any task (the worker's
    warm-up, from a render's hint: `farm.worker.warmup`), unless a task of this process already asked for
    a decoder (the hint is then late, or stale). True when it is built; `on_built` is called then, before
    any task can take it. Its state shows in `preloads`."""
    spec, key = _keyed(spec, device, compile)
    with _cache_lock:
        if _asked:  # a task asked first: the hint is late (its decoder is built) or stale
            return False
        _built(spec, key)
        _preloads.setdefault(key, [f"{spec.describe()} on {device}", "waiting"])
        if on_built is not None:
            on_built()
        return True


def preloads() -> dict[str, str]:
    """The decoders this process's warm-up preloaded, by name on their device: "waiting" for a task,
    "taken" by one, or "dropped" (a task asked for another decoder first, and it was freed)."""
    with _cache_lock:
        return {name: state for name, state in _preloads.values()}


def _keyed(
    spec: DecoderSpec | dict[str, Any], device: str, compile: bool | str
) -> tuple[DecoderSpec, CacheKey]:
    """The parsed spec and its key in the decoder cache: the spec with the weights' content identity, the
    device and the compile mode."""
    if not isinstance(spec, DecoderSpec):
        spec = parse_spec(spec, families=FAMILIES)
    mode = compile_mode(compile) if device.startswith("cuda") else None
    raw = spec.to_json()
    if "path" in spec.weights and "identity" not in spec.weights:  # a spec never checked: key by the
        raw["weights"] = {**spec.weights, "identity": weights_identity(spec)}  # files' identity all the same
    return spec, (json.dumps(raw, sort_keys=True), device, mode)


def _built(spec: DecoderSpec, key: CacheKey) -> VideoDecoder:
    """The cached decoder of `key`, built now when it is not there (the cache's lock held)."""
    _, device, mode = key
    if key not in _cache:
        started = time.perf_counter()
        check_pinned(spec)  # the files the render checked, before and after they are read
        decoder = decoder_class(spec).load(spec, device)
        check_pinned(spec)
        _timings["load_s"][f"{spec.describe()} on {device}"] = time.perf_counter() - started
        if mode is not None:
            use_compile_cache()
            decoder.enable_compile(None if mode == "default" else mode)
        decoder.decode = _timing_first_calls(decoder.decode, mode or "eager")  # type: ignore[method-assign]
        _cache[key] = decoder
    return _cache[key]


def weights_identity(spec: DecoderSpec) -> str:
    """The content identity of the spec's weight files (`farm.decoders.checkpoints.content_identity`)."""
    from pathlib import Path

    return content_identity(weight_files(Path(spec.weights["path"])))


def use_compile_cache() -> str | None:
    """Point torch inductor's on-disk cache at ``farm.compile-cache`` when it is set: compiled graphs and
    kernels are then found again by every later worker process and render that compiles the same
    decoder for the same tile shape (a shared folder serves several machines alike). Returns the
    folder in use (None: inductor's own choice, ``TORCHINDUCTOR_CACHE_DIR`` or its default).

    The farm setting overrides ``TORCHINDUCTOR_CACHE_DIR``: importing ``torch._dynamo`` (diffusers
    does) already sets that variable to inductor's default, so only an override takes effect.

    Inductor keys a compiled graph by the traced graph, its input shapes and dtypes, the torch version
    and the device: a new tile shape compiles once, and a fresh cluster's workers find it in
    the cache in a fraction of the cold time (docs/performance.md#compile-cache).
    """
    cache = config.get("compile-cache")
    if cache:  # inductor reads the variable at each compile (torch._inductor.runtime.cache_dir_utils)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(os.path.expanduser(str(cache)))
    return os.environ.get("TORCHINDUCTOR_CACHE_DIR")


def _timing_first_calls(decode: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """`decode`, recording in `_timings` how long its first call for each latent shape took."""
    seen: set[tuple[int, ...]] = set()

    def timed(latent: Any, *args: Any, **kwargs: Any) -> Any:
        shape = tuple(latent.shape)
        if shape in seen:
            return decode(latent, *args, **kwargs)
        started = time.perf_counter()
        result = decode(latent, *args, **kwargs)
        seen.add(shape)
        _timings["first_call_s"][f"{mode} {list(shape)}"] = time.perf_counter() - started
        return result

    return timed


def decoder_timings() -> dict[str, dict[str, float]]:
    """This process's decoder build seconds and first-call seconds per mode and latent shape (run it on
    the workers, ``client.run(decoder_timings)``, to see what a render paid for loading and compiling)."""
    return {k: dict(v) for k, v in _timings.items()}


# torch.compile modes farm accepts. "reduce-overhead" replays the decoder as CUDA graphs (one launch per
# decode, so other threads holding the GIL cannot starve the GPU); it keeps the graphs' memory pool.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(compile: bool | str | None) -> str | None:
    """`compile` as given to :func:`load_decoder` → a mode name, or None for no compilation."""
    if compile is None or compile is False:
        return None
    if compile is True:
        return "default"
    if compile not in COMPILE_MODES:
        raise FarmError(f"unknown torch.compile mode {compile!r}; choose one of {', '.join(COMPILE_MODES)}")
    return compile


def spec_from_json(raw: dict[str, Any], where: str = "decoder spec") -> DecoderSpec:
    return parse_spec(raw, families=FAMILIES, where=where)


__all__ = ["FAMILIES", "DecoderSpec", "VideoDecoder", "load_decoder", "spec_from_json", "parse_spec"]
