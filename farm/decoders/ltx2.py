"""LTX-2 video VAE decoder (diffusers `AutoencoderKLLTX2Video`): 32x spatial, 8x temporal, causal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from farm.decoders.base import DecoderSpec, dtype_bytes
from farm.errors import FarmError
from farm.tiling import Geometry

# Same class as the real model, a few channels: decodes 17x128x192 in ~0.1 s on one CPU core.
LTX2_TINY = {
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "decoder_block_out_channels": [8, 16, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_layers_per_block": [1, 1, 1, 1],
}

# Peak device memory of an untiled bf16 decode grows ~118 bytes per output pixel-frame above the weights
# (H200 measurements in shared/FINDINGS.md: 121x704x1216 13.7 GiB, 121x352x1216 8.0 GiB, 49x704x1216 7.0 GiB).
# Other configs scale with the width of the last decoder block.
_BYTES_PER_PIXEL_FRAME_LTX2_BF16 = 118
_LTX2_LAST_BLOCK_CHANNELS = 256


class LTX2Decoder:
    family: ClassVar[str] = "ltx2"
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {"ltx2": {}, "ltx2-tiny": LTX2_TINY}

    def __init__(self, spec: DecoderSpec, model: Any, device: str) -> None:
        import torch

        self.spec = spec
        self.model = model
        self.device = device
        self.torch_dtype = getattr(torch, spec.dtype)
        self.geometry = self.geometry_for(spec.config)
        self.latent_channels = self.latent_channels_for(spec.config)

    # ---- shapes --------------------------------------------------------------------------------

    @classmethod
    def _full_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        import inspect

        from diffusers import AutoencoderKLLTX2Video

        defaults = {
            name: p.default
            for name, p in inspect.signature(AutoencoderKLLTX2Video.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        return {**defaults, **config}

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        full = cls._full_config(config)
        n_blocks = len(full["decoder_block_out_channels"])
        scaling = full["decoder_spatio_temporal_scaling"]
        if isinstance(scaling, bool):
            scaling = [scaling] * n_blocks
        kinds = [k for k, on in zip(full["upsample_type"], scaling, strict=False) if on]
        spatial = full["patch_size"] * 2 ** sum(k in ("spatial", "spatiotemporal") for k in kinds)
        temporal = full["patch_size_t"] * 2 ** sum(k in ("temporal", "spatiotemporal") for k in kinds)
        # The first latent frame decodes to one pixel frame whatever the padding mode: tiles need the shift.
        return Geometry(spatial_scale=spatial, temporal_scale=temporal, causal=True)

    @classmethod
    def latent_channels_for(cls, config: dict[str, Any]) -> int:
        return int(cls._full_config(config)["latent_channels"])

    @classmethod
    def peak_bytes(cls, spec: DecoderSpec, pixel_volume: int) -> int:
        full = cls._full_config(spec.config)
        width = full["decoder_block_out_channels"][0] / _LTX2_LAST_BLOCK_CHANNELS
        per_pixel = _BYTES_PER_PIXEL_FRAME_LTX2_BF16 * width * dtype_bytes(spec.dtype) / 2
        return int(cls.weight_bytes(spec) + per_pixel * pixel_volume)

    @classmethod
    def weight_bytes(cls, spec: DecoderSpec) -> int:
        full = cls._full_config(spec.config)
        # decoder parameters scale with the square of the block widths; 528 M for the real config
        widths = full["decoder_block_out_channels"]
        rel = sum(w * w for w in widths) / sum(w * w for w in (256, 512, 1024))
        return int(528e6 * rel * dtype_bytes(spec.dtype))

    # ---- loading -------------------------------------------------------------------------------

    @classmethod
    def build(cls, spec: DecoderSpec) -> Any:
        """The diffusers model for the spec's config, weights loaded (or seeded), in float32 on the CPU."""
        import torch
        from diffusers import AutoencoderKLLTX2Video

        try:
            if spec.random_weights:
                torch.manual_seed(int(spec.weights["random_seed"]))
            model = AutoencoderKLLTX2Video(**spec.config)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise FarmError(f"decoder config for {spec.family} is invalid: {exc}") from None
        if not spec.random_weights:
            state = load_safetensors_weights(Path(spec.weights["path"]), spec.config)
            apply_weights(model, state, where=spec.weights["path"])
        return model.eval()

    @classmethod
    def load(cls, spec: DecoderSpec, device: str) -> LTX2Decoder:
        import torch
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.set_verbosity_error()  # a cast of a model with no fp32-only modules warns anyway
        model = cls.build(spec)
        model.encoder = torch.nn.Identity()  # decode only: don't hold the encoder's weights on the GPU
        model.to(device=device, dtype=getattr(torch, spec.dtype))
        return cls(spec, model, device)

    @classmethod
    def check_weights(cls, spec: DecoderSpec) -> None:
        check_weights(spec)

    def enable_compile(self) -> None:
        import torch

        self.model.decoder = torch.compile(self.model.decoder)

    # ---- decoding ------------------------------------------------------------------------------

    def decode(self, latent: Any) -> Any:
        import torch

        with torch.inference_mode():
            z = latent.to(device=self.device, dtype=self.torch_dtype)[None]
            if self.spec.latents == "normalized":
                mean = self.model.latents_mean.view(1, -1, 1, 1, 1).to(z)
                std = self.model.latents_std.view(1, -1, 1, 1, 1).to(z)
                z = z * std / self.model.config.scaling_factor + mean
            temb = None
            if self.model.config.timestep_conditioning:
                t = float(self.spec.extra.get("decode_timestep", 0.0))
                temb = torch.tensor([t], device=self.device, dtype=self.torch_dtype)
            pixels = self.model.decode(z, temb=temb, return_dict=False)[0][0]
            return (pixels.float() + 1.0) / 2.0  # [-1, 1] → nominally [0, 1]; clamped at uint8 time


def load_safetensors_weights(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Tensors from one .safetensors file, or every .safetensors file of a diffusers folder."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FarmError(
                f"weights folder {str(path)!r} holds no .safetensors file; expected a diffusers folder "
                "(config.json + diffusion_pytorch_model.safetensors) as written by save_pretrained"
            )
        cfg_file = path / "config.json"
        if cfg_file.exists():
            check_config_matches(json.loads(cfg_file.read_text()), config, where=str(cfg_file))
    else:
        files = [path]
    state: dict[str, Any] = {}
    for f in files:
        try:
            state.update(load_file(str(f)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise FarmError(f"weights file {str(f)!r} is not a readable .safetensors file: {exc}") from None
    return state


def check_config_matches(folder_config: dict[str, Any], spec_config: dict[str, Any], where: str) -> None:
    def norm(v: Any) -> Any:
        return list(v) if isinstance(v, tuple | list) else v

    full_spec = LTX2Decoder._full_config(spec_config)
    diffs = [
        f"{k}: weights have {folder_config[k]!r}, spec has {full_spec[k]!r}"
        for k in sorted(folder_config)
        if not k.startswith("_") and k in full_spec and norm(folder_config[k]) != norm(full_spec[k])
    ]
    if diffs:
        raise FarmError(
            f"weights at {where} were saved for a different decoder config than the job's spec: "
            + "; ".join(diffs[:5])
            + ("; …" if len(diffs) > 5 else "")
            + ". Put the weights' config in the job's decoder spec, or use the weights the job was made for"
        )


def weight_mismatches(expected: dict[str, tuple[int, ...]], given: dict[str, tuple[int, ...]]) -> list[str]:
    """How a checkpoint's tensor shapes differ from the decoder's: empty when they fit."""
    missing = [k for k in expected if k.startswith("decoder.") and k not in given]
    unexpected = [k for k in given if k not in expected]
    wrong_shape = [
        f"{k} {given[k]} ≠ {expected[k]}" for k in given if k in expected and given[k] != expected[k]
    ]
    parts = []
    if missing:
        parts.append(f"{len(missing)} decoder tensors missing (e.g. {missing[0]})")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors the model does not have (e.g. {unexpected[0]})")
    if wrong_shape:
        parts.append(f"{len(wrong_shape)} with other shapes (e.g. {wrong_shape[0]})")
    return parts


def _raise_mismatch(parts: list[str], where: str) -> None:
    raise FarmError(
        f"weights at {where} do not match the decoder config: " + "; ".join(parts)
        + ". Check the spec's family and config against the checkpoint"
    )  # fmt: skip


def apply_weights(model: Any, state: dict[str, Any], where: str) -> None:
    """Load a state dict strictly for the decoder: every decoder tensor present, every shape equal."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    parts = weight_mismatches(expected, {k: tuple(v.shape) for k, v in state.items()})
    if parts:
        _raise_mismatch(parts, where)
    model.load_state_dict(state, strict=False)


def check_weights(spec: DecoderSpec) -> None:
    """Refuse weights that do not fit the spec's config, reading only file headers (no tensors, no GPU)."""
    if spec.random_weights:
        return
    import torch
    from diffusers import AutoencoderKLLTX2Video
    from safetensors import SafetensorError, safe_open

    path = Path(spec.weights["path"])
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if path.is_dir():
        if not files:
            raise FarmError(
                f"weights folder {str(path)!r} holds no .safetensors file; expected a diffusers folder "
                "(config.json + diffusion_pytorch_model.safetensors) as written by save_pretrained"
            )
        if (path / "config.json").exists():
            check_config_matches(json.loads((path / "config.json").read_text()), spec.config, str(path))
    given: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for key in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    given[key] = tuple(fh.get_slice(key).get_shape())
        except (SafetensorError, OSError, ValueError) as exc:
            raise FarmError(f"weights file {str(f)!r} is not a readable .safetensors file: {exc}") from None
    with torch.device("meta"):
        model = AutoencoderKLLTX2Video(**spec.config)
    parts = weight_mismatches({k: tuple(v.shape) for k, v in model.state_dict().items()}, given)
    if parts:
        _raise_mismatch(parts, str(path))
