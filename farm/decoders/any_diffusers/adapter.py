"""Any diffusers video VAE, named by its class: ``{"family": "diffusers", "class": "AutoencoderKLMagvit",
"weights": {"path": "/models/vae"}}`` (a folder as ``save_pretrained`` writes it: ``config.json`` and the
weights, as ``AutoencoderKL*.from_pretrained`` reads them).

The config is the folder's ``config.json`` (the job records it); the class must be a diffusers autoencoder
whose ``decode`` takes video latents ``[B, C, F, H, W]``. Its shapes are read off ``vae.decode`` itself,
run on the meta device (no memory, no weights) on 1, 2 and 3 latent frames: the spatial scale, the
temporal scale, and whether the first latent frame decodes to one pixel frame. A class whose decode does
not run that way (or is not a video VAE) is refused in one line.

farm knows nothing of such a decoder's seams, so it decodes every shot whole, as ``vae.decode`` does with
the class's defaults (`farm plan` says so): no temporal tiles or chunks, and spatial tiles only where the
spec gives ``"halo": N``, the latent rows and columns a tile decodes beyond its own (measured by
`benchmarks/measure_halo.py`). Its latents are the ones ``vae.decode`` takes (``"latents":
"denormalized"``): farm does not know the pipeline's un-normalisation.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from farm.decoders.base import DecoderSpec
from farm.decoders.diffusers_vae import DiffusersVideoDecoder
from farm.decoders.geometry import Geometry
from farm.errors import FarmError

FAMILY = "diffusers"
PROBE_HW = 8  # latent rows and columns of the shape probe


class AnyDiffusersDecoder(DiffusersVideoDecoder):
    family: ClassVar[str] = FAMILY
    named_configs: ClassVar[dict[str, dict[str, Any]]] = {}
    model_class_name: ClassVar[str] = ""  # the spec's "class": each has a class of its own (`for_spec`)
    spec_fields: ClassVar[dict[str, tuple[tuple[type, ...], str]]] = {
        "class": ((str,), 'a diffusers video VAE class name, e.g. "AutoencoderKLMagvit"'),
        "halo": ((int,), "the latent rows and columns a spatial tile decodes beyond its own (measured)"),
    }

    @classmethod
    def for_spec(cls, spec: DecoderSpec) -> type[DiffusersVideoDecoder]:
        return _adapter_for(_class_name(spec.extra.get("class"), "decoder spec"))

    @classmethod
    def unnamed_config(cls, raw: dict[str, Any], where: str) -> dict[str, Any] | None:
        """The weights folder's ``config.json``, for the class the spec names."""
        name = _class_name(raw.get("class"), where)
        path = raw.get("weights", {}).get("path") if isinstance(raw.get("weights"), dict) else None
        config_file = Path(path) / "config.json" if isinstance(path, str) else None
        if config_file is None or not config_file.is_file():
            raise FarmError(
                f"{where}: the diffusers family reads its config from the weights folder's config.json; give "
                f'"weights": {{"path": "/folder/written/by/save_pretrained"}} (or the constructor arguments '
                'as "config")'
            )
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError) as exc:
            raise FarmError(f"{where}: {config_file} is not readable JSON ({exc})") from None
        saved = config.get("_class_name")
        if saved not in (None, name):
            raise FarmError(f"{where}: {config_file} holds a {saved} config, not a {name} one: give "
                            f"\"class\": {saved!r}, or the folder of a {name}")  # fmt: skip
        return {k: v for k, v in config.items() if not k.startswith("_")}

    @classmethod
    def check_spec(cls, spec: DecoderSpec) -> None:
        super().check_spec(spec)
        if spec.latents == "normalized":
            raise FarmError(
                f"decoder spec: the diffusers family ({spec.extra.get('class')}) decodes the latents "
                "vae.decode takes; farm does not know its pipeline's un-normalisation: use \"latents\": "
                "\"denormalized\""
            )
        halo = spec.extra.get("halo")
        if halo is not None and halo < 0:
            raise FarmError(f"decoder spec: 'halo' {halo} is invalid; give 0 or more latent rows and columns")

    @classmethod
    def plan_note(cls, spec: DecoderSpec) -> str | None:
        halo = spec.extra.get("halo")
        if halo is None:
            return (f"{spec.extra.get('class')}: farm measured none of its seams, so each shot decodes "
                    'untiled, in one piece; give "halo": N (measured with benchmarks/measure_halo.py) to '
                    "split rows and columns")  # fmt: skip
        return (f"{spec.extra.get('class')}: spatial tiles with the spec's halo of {halo}, shots whole in "
                "time (farm measured none of its seams)")  # fmt: skip

    @classmethod
    def geometry_for(cls, config: dict[str, Any]) -> Geometry:
        spatial, temporal, causal = _probe(cls.model_class_name, json.dumps(config, sort_keys=True))
        return Geometry(spatial, temporal, causal=causal, whole_time=True, whole_space=True)

    @classmethod
    def geometry_for_spec(cls, spec: DecoderSpec) -> Geometry:
        geometry = cls.geometry_for(spec.config)
        halo = spec.extra.get("halo")
        return geometry if halo is None else replace(geometry, halo=halo, whole_space=False)

    @classmethod
    def latent_channels_for(cls, config: dict[str, Any]) -> int:
        full = cls._full_config(config)
        for key in ("latent_channels", "z_dim"):
            if isinstance(full.get(key), int):
                return int(full[key])
        raise FarmError(f"{cls.model_class_name}'s config names no latent channels (latent_channels or "
                        "z_dim): farm cannot check latents against it")  # fmt: skip

    def denormalize(self, z: Any) -> Any:
        raise FarmError("the diffusers family decodes denormalized latents only")


def _class_name(name: Any, where: str) -> str:
    """`name` if diffusers exports an autoencoder class by that name, else a FarmError."""
    if not isinstance(name, str) or not name:
        raise FarmError(f'{where}: the diffusers family needs "class": a diffusers video VAE class name, '
                        'e.g. "AutoencoderKLMagvit"')  # fmt: skip
    import importlib

    diffusers = importlib.import_module("diffusers")
    model_cls = getattr(diffusers, name, None)
    if not (isinstance(model_cls, type) and issubclass(model_cls, diffusers.ModelMixin)
            and name.startswith("Autoencoder") and hasattr(model_cls, "decode")):  # fmt: skip
        raise FarmError(f"{where}: {name!r} is not a diffusers video VAE class (an Autoencoder* model of "
                        "diffusers whose decode takes [B, C, F, H, W] latents, e.g. "
                        "AutoencoderKLMagvit)")  # fmt: skip
    return name


@functools.cache
def _adapter_for(name: str) -> type[AnyDiffusersDecoder]:
    """The adapter of one diffusers class (one per class name, so class-level lookups find its class)."""
    return type(f"Diffusers{name}Decoder", (AnyDiffusersDecoder,), {"model_class_name": name})


@functools.cache
def _probe(name: str, config_json: str) -> tuple[int, int, bool]:
    """(spatial scale, temporal scale, causal) of ``vae.decode`` of class `name` at a config, run on the
    meta device on 1, 2 and 3 latent frames; FarmError where it does not decode video latents."""
    import importlib

    import torch

    config = json.loads(config_json)
    model_cls = getattr(importlib.import_module("diffusers"), name)
    channels = config.get("latent_channels", config.get("z_dim"))
    try:
        with torch.device("meta"):
            model = model_cls(**config).eval()
        channels = channels or model.config.get("latent_channels") or model.config.get("z_dim")
        frames, width = [], 0
        with torch.inference_mode():
            for f in (1, 2, 3):
                z = torch.empty((1, int(channels), f, PROBE_HW, PROBE_HW), device="meta")
                out = model.decode(z, return_dict=False)[0]
                if out.ndim != 5:
                    raise ValueError(f"decode returned {out.ndim} dimensions, not [B, C, F, H, W]")
                frames.append(int(out.shape[2]))
                width = int(out.shape[-1])
    except Exception as exc:  # noqa: BLE001  (any failure of the class's own code means: not decodable here)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise FarmError(f"{name} is not a diffusers video VAE farm can decode: its vae.decode of video "
                        f"latents [1, C, F, {PROBE_HW}, {PROBE_HW}] failed ({type(exc).__name__}: "
                        f"{first})") from None  # fmt: skip
    t = frames[2] - frames[1]
    if width % PROBE_HW or t < 1 or frames[1] - frames[0] != t or frames[0] not in (1, t):
        raise FarmError(f"{name}: vae.decode turns 1, 2, 3 latent frames into {frames} frames and "
                        f"{PROBE_HW} columns into {width}: no fixed scale farm can plan by")  # fmt: skip
    return width // PROBE_HW, t, frames[0] == 1
