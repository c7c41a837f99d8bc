"""What diffusers video pipelines hand back with ``output_type="latent"``, and how farm takes it.

Read from the pipelines' source (diffusers 0.42; tests/test_ingest.py checks the source says so):

* ``LTXPipeline``, ``LTXImageToVideoPipeline``: packed ``[B, S, D]`` tokens, normalized (``ltxv``);
* ``LTXConditionPipeline``: ``[B, C, F, H, W]``, normalized (``ltxv``);
* ``LTX2Pipeline``, ``LTX2ImageToVideoPipeline``, ``LTX2ConditionPipeline``: ``[B, C, F, H, W]`` (the
  video's ``frames``), denormalized (``ltx2``; LTX-2 and LTX-2.3 alike); their ``audio`` is the sound's
  latents ``[B, C, T, M]``, denormalized and unpacked (ready for ``audio_vae.decode``);
* ``LTX2HDRPipeline`` (HDR IC-LoRA): the same, and its VAE decodes to LogC3 codes, not a picture: the
  spec records ``"hdr": "logc3"`` (its ``hdr_video_processor``'s ``hdr_transform``) and float32, the
  dtype the pipeline's HDR post-processing runs in (`farm.media.hdr`);
* ``WanPipeline``, ``WanImageToVideoPipeline``, ``WanVideoToVideoPipeline``, and the pipelines that reuse
  Wan's VAE and un-normalise as WanPipeline does: ``Cosmos2VideoToWorldPipeline`` (Cosmos-Predict2; its
  scheduler's ``sigma_data`` is set to 1), ``Cosmos2_5_PredictBasePipeline`` (Cosmos-Predict2.5),
  ``Cosmos3OmniPipeline`` (Cosmos 3, the Wan 2.2 VAE), ``SkyReelsV2Pipeline``,
  ``SkyReelsV2ImageToVideoPipeline``, ``SkyReelsV2DiffusionForcingPipeline`` and
  ``SkyReelsV2DiffusionForcingVideoToVideoPipeline`` (its video: the input's frames, then these):
  ``[B, C, F, H, W]``, normalized (``wan``);
* ``HunyuanVideoPipeline``, ``HunyuanVideoImageToVideoPipeline``, ``HunyuanSkyreelsImageToVideoPipeline``:
  ``[B, C, F, H, W]``, normalized (``hunyuanvideo``); ``Kandinsky5T2VPipeline``, ``Kandinsky5I2VPipeline``
  (HunyuanVideo's VAE): channels last, ``[B, F, H, W, C]`` (moved here as the pipeline moves them),
  normalized;
* ``HunyuanVideo15Pipeline``, ``HunyuanVideo15ImageToVideoPipeline``: ``[B, C, F, H, W]``, normalized
  (``hunyuanvideo15``);
* ``CosmosTextToWorldPipeline``, ``CosmosVideoToWorldPipeline`` (Cosmos 1.0): ``[B, C, F, H, W]``,
  normalized (``cosmos``); the spec made from the pipeline records its scheduler's ``sigma_data``;
* ``MiniMaxH3ModularPipeline`` (a modular pipeline: no ``output_type="latent"``; its latents are what its
  video decode step takes, run without the decode blocks): ``[B, C, F, H, W]``, normalized (``minimax-h3``);
  its ``audio_latents`` are the sound's ``[2, C, T]`` (the two stereo channels), normalized, as its audio
  decode step takes them (``minimax-h3-audio`` un-normalises them as that step does);
* ``CogVideoXPipeline``, ``CogVideoXImageToVideoPipeline``, ``CogVideoXVideoToVideoPipeline``,
  ``CogVideoXFunControlPipeline``: ``[B, F, C, H, W]`` (frames before channels), normalized
  (``cogvideox``); CogVideoX1.5's pad the latent frames at the start, which farm drops as they do;
* ``MochiPipeline``: ``[B, C, F, H, W]``, normalized (``mochi``).

"normalized": the pipeline would un-normalise before ``vae.decode`` (LTX: ``z·std/scaling_factor + mean``;
Wan, MiniMax-H3: ``z·std + mean``; HunyuanVideo and 1.5, CogVideoX: ``z / scaling_factor``; Mochi:
``z·std/scaling_factor + mean``; Cosmos 1.0: ``z·std/sigma_data + mean`` per channel and latent frame),
and farm does the same when the job's spec says ``"latents": "normalized"``. "denormalized": ready for
``vae.decode`` (LTX-2 un-normalises before it returns). LTX-Video's packed tokens are unpacked here with
the frame count and size the pipeline was
called with, exactly as its ``_unpack_latents`` does. Not covered: ``WanVACEPipeline`` (its latents start
with the reference images' frames), ``HunyuanVideoFramepackPipeline`` (it decodes section by section),
``SkyReelsV2DiffusionForcingImageToVideoPipeline`` (with a last image its latents end with that image's
frames, which it drops before decoding) and ``Cosmos2_5_TransferPipeline`` (it decodes chunk by chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from farm.decoders import FAMILIES
from farm.decoders.base import HDR_TRANSFERS
from farm.decoders.sound import sound_spec_from_pipeline
from farm.errors import FarmError
from farm.inputs.latent_files import torch_to_numpy
from farm.planning.tiling import Geometry


@dataclass(frozen=True)
class PipelineConvention:
    family: str  # the farm decoder family of the pipeline's VAE
    latents: str  # "normalized" or "denormalized"
    packed: bool  # True: [B, S, D] token sequence (LTX-Video); False: [B, C, F, H, W]
    axes: str = "BCFHW"  # the order of a 5-D output's axes (the adapter's `pipeline_latent_axes`)


# Every pipeline class an adapter declares (`pipeline_conventions`), with its family.
PIPELINES: dict[str, PipelineConvention] = {
    name: PipelineConvention(family, latents, packed, cls.pipeline_latent_axes.get(name, "BCFHW"))
    for family, cls in FAMILIES.items()
    for name, (latents, packed) in cls.pipeline_conventions.items()
}


# Pipelines whose VAE decodes HDR codes, with the transfer they post-process with (decoder spec "hdr").
HDR_PIPELINES = {"LTX2HDRPipeline": "logc3"}


def pipeline_hdr(pipeline: Any) -> str | None:
    """The HDR transfer of the pipeline's decoded values (None: an SDR pipeline). An instance says its own
    (``hdr_video_processor.config.hdr_transform``); a class name, its default."""
    name = pipeline_name(pipeline)
    if name not in HDR_PIPELINES:
        return None
    processor = getattr(pipeline, "hdr_video_processor", None)
    transfer = getattr(getattr(processor, "config", None), "hdr_transform", None) or HDR_PIPELINES[name]
    if transfer not in HDR_TRANSFERS:
        raise FarmError(f"{name} post-processes with HDR transfer {transfer!r}; farm decodes "
                        f"{list(HDR_TRANSFERS)}")  # fmt: skip
    return str(transfer)


def pipeline_name(pipeline: Any) -> str:
    return pipeline if isinstance(pipeline, str) else type(pipeline).__name__


def convention_of(pipeline: Any) -> PipelineConvention:
    """The convention of a pipeline (an instance or its class name); FarmError for ones farm does not know."""
    name = pipeline_name(pipeline)
    if name not in PIPELINES:
        raise FarmError(
            f"farm does not know what {name} returns with output_type='latent'; known pipelines: "
            f"{', '.join(sorted(PIPELINES))}. Save the latents [B, C, F, H, W] yourself and use "
            "`farm ingest` with --latents"
        )
    return PIPELINES[name]


def to_numpy(latents: Any) -> np.ndarray:
    """A torch tensor (any device; bfloat16 becomes float32) or an array → a numpy array."""
    import torch


    if isinstance(latents, np.ndarray):
        return latents
    if isinstance(latents, torch.Tensor):
        return torch_to_numpy(latents)
    raise FarmError(f"latents must be a torch tensor or a numpy array, got {type(latents).__name__}")


def unpack_tokens(
    tokens: np.ndarray, latent_fhw: tuple[int, int, int], patch: int = 1, patch_t: int = 1
) -> np.ndarray:
    """LTX-Video's packed ``[B, S, D]`` → ``[B, C, F, H, W]`` (``LTXPipeline._unpack_latents``)."""
    f, h, w = latent_fhw
    b, s, d = tokens.shape
    expected = (f // patch_t) * (h // patch) * (w // patch)
    if s != expected or d % (patch_t * patch * patch):
        raise FarmError(
            f"packed latents [B, S, D] = {list(tokens.shape)} do not hold {f}x{h}x{w} latent positions "
            f"(S would be {expected}); pass the num_frames, height and width the pipeline was called with"
        )
    x = tokens.reshape(b, f // patch_t, h // patch, w // patch, -1, patch_t, patch, patch)
    x = x.transpose(0, 4, 1, 5, 2, 6, 3, 7)
    return np.ascontiguousarray(x.reshape(b, x.shape[1], f, h, w))


def latent_size(geometry: Geometry, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
    """Latent frames, rows and columns of a pipeline call of that many pixel frames and that size."""
    s, t = geometry.spatial_scale, geometry.temporal_scale
    if geometry.clip is not None:  # the pipeline's frame counts are the decoder's own
        return geometry.latent_frames(num_frames) or 0, height // s, width // s
    return ((num_frames - 1) // t + 1 if geometry.causal else num_frames // t), height // s, width // s


def pipeline_latents(
    pipeline: Any,
    latents: Any,
    geometry: Geometry,
    *,
    num_frames: int | None,
    height: int | None,
    width: int | None,
) -> tuple[np.ndarray, PipelineConvention]:
    """The pipeline's latent output as ``[B, C, F, H, W]`` numpy (its family's `from_pipeline_output`:
    CogVideoX's pipelines return ``[B, F, C, H, W]``), with its convention."""
    conv = convention_of(pipeline)
    data = to_numpy(latents)
    if conv.packed and data.ndim == 3:
        if None in (num_frames, height, width):
            raise FarmError(
                f"{pipeline_name(pipeline)} returns packed latents [B, S, D]: pass num_frames, height and "
                "width as given to the pipeline, so farm can unpack them"
            )
        patch = int(getattr(getattr(pipeline, "transformer", None), "config", {}).get("patch_size", 1) or 1)
        patch_t = int(
            getattr(getattr(pipeline, "transformer", None), "config", {}).get("patch_size_t", 1) or 1
        )
        fhw = latent_size(geometry, num_frames, height, width)  # type: ignore[arg-type]
        data = unpack_tokens(data, fhw, patch, patch_t)
    layout = FAMILIES[conv.family].pipeline_layout
    if data.ndim == 4:
        data = data[None]
    if data.ndim != 5:
        raise FarmError(
            f"{pipeline_name(pipeline)} latents have shape {list(data.shape)}; expected "
            + (layout if conv.axes == "BCFHW" else f"[{', '.join(conv.axes)}]")
            + (" or packed [B, S, D]" if conv.packed else "")
        )
    if conv.axes != "BCFHW":  # e.g. channels last: moved as the pipeline moves them before vae.decode
        data = np.ascontiguousarray(data.transpose([conv.axes.index(a) for a in "BCFHW"]))
    return FAMILIES[conv.family].from_pipeline_output(pipeline, data, num_frames), conv


def spec_from_pipeline(pipeline: Any, weights: str | None = None, dtype: str | None = None) -> dict[str, Any]:
    """A decoder spec (JSON) for the pipeline's own VAE: its class, its config, and its weights' folder.

    The weights are `weights`, or the local folder the VAE was loaded from (``from_pretrained``)."""
    from pathlib import Path


    vae = getattr(pipeline, "vae", None)
    if vae is None:
        raise FarmError("give decoder= (the pipeline has no vae to take the decoder spec from)")
    vae_class = type(vae).__name__
    family = next((f for f, c in FAMILIES.items() if c.model_class_name == vae_class), None)
    if family is None:
        raise FarmError(f"farm has no decoder for {type(vae).__name__}; known: {sorted(FAMILIES)}")
    config = {k: v for k, v in dict(vae.config).items() if not k.startswith("_")}
    source = weights or vae.config.get("_name_or_path")
    if (
        not source
        or not (Path(source) / "config.json").is_file()
        and not str(source).endswith(".safetensors")
    ):
        raise FarmError(
            "the pipeline's VAE was not loaded from a local folder: pass weights= (a folder written by "
            "vae.save_pretrained, or one .safetensors file) or decoder= (a spec)"
        )
    torch_dtype = str(getattr(vae, "dtype", "float32")).removeprefix("torch.")
    chosen = dtype or (torch_dtype if torch_dtype in ("float32", "bfloat16", "float16") else "float32")
    hdr = pipeline_hdr(pipeline)
    if hdr is not None:  # HDR decodes run in float32, as the pipelines' HDR paths do
        return {"family": family, "config": config, "weights": {"path": str(source)}, "dtype": "float32",
                "hdr": hdr}  # fmt: skip
    return {"family": family, "config": config, "weights": {"path": str(source)}, "dtype": chosen,
            **FAMILIES[family].spec_fields_from_pipeline(pipeline)}  # fmt: skip


def audio_spec_from_pipeline(pipeline: Any, weights: str | None = None) -> dict[str, Any]:
    """An audio decoder spec (JSON) for the pipeline's own sound decoder (`farm.decoders.sound`, by its
    ``audio_vae``'s class): its config, and the folder it was loaded from, or `weights`."""
    return sound_spec_from_pipeline(pipeline, weights)
