"""The decoder config LTX-Video 0.9.x single files carry, read as Lightricks' `ltx-video` reads it, in the
terms of diffusers' ``AutoencoderKLLTXVideo``.

The files hold ``__metadata__["config"]`` → ``"vae"`` (`farm.decoders.checkpoints.file_vae_config`) with
ltx-video's keys; ltx-video 0.1.2 builds its decoder from them
(``CausalVideoAutoencoder.from_config`` in ``ltx_video/models/autoencoders/causal_video_autoencoder.py``)
with its own defaults for missing keys, which are not ltx-core's: no timestep conditioning, zero
padding, group norm, a ``post_quant_conv``. :func:`ltxv_decoder_config` turns them into the constructor
arguments that shape diffusers' decoder, and refuses what that class cannot compute. Pure: no torch.
"""

from __future__ import annotations

from typing import Any

from farm.decoders.ltx2.metadata import block_settings as _block
from farm.errors import FarmError

# ltx-video's defaults for keys a file's `vae` config leaves out (CausalVideoAutoencoder.from_config)
LTX_VIDEO_DEFAULTS: dict[str, Any] = {
    "dims": 3,
    "out_channels": 3,
    "patch_size": 1,
    "norm_layer": "group_norm",
    "causal_decoder": False,
    "timestep_conditioning": False,
    "decoder_base_channels": 128,
    "spatial_padding_mode": "zeros",
    "use_quant_conv": True,
    "normalize_latent_channels": False,
}
# diffusers' scalar arguments ← ltx-video's keys
_SCALARS: tuple[tuple[str, str, type], ...] = (
    ("latent_channels", "latent_channels", int),
    ("out_channels", "out_channels", int),
    ("patch_size", "patch_size", int),
    ("timestep_conditioning", "timestep_conditioning", bool),
    ("decoder_causal", "causal_decoder", bool),
)
# what diffusers' AutoencoderKLLTXVideo computes, whatever its other arguments
_FIXED = {"dims": 3, "norm_layer": "pixel_norm", "spatial_padding_mode": "zeros", "use_quant_conv": False,
          "normalize_latent_channels": False}  # fmt: skip


def ltxv_decoder_config(vae: dict[str, Any], where: str) -> dict[str, Any]:
    """ltx-video's ``vae`` config → the decoder's constructor arguments of ``AutoencoderKLLTXVideo``.

    ltx-video lists the blocks encoder-wise (``decoder_blocks``, else the shared ``blocks``) and builds the
    decoder from the reversed list: a ``res_x`` mid block, then groups of an optional ``res_x_y`` (channels
    divided by its multiplier, default 2), an optional ``compress_all`` 2x2x2 upsampler (channels divided by
    its multiplier, default 1; ``residual``) and a ``res_x``. diffusers builds each group as an up block
    (``conv_in``, upsampler, resnets) and keeps its per-block lists encoder-wise too.
    """
    listed = vae.get("decoder_blocks", vae.get("blocks"))
    # a config without its blocks is not one ltx-video can build: compare what it states, nothing more
    cfg = {**LTX_VIDEO_DEFAULTS, **vae} if listed is not None else dict(vae)
    wrong = [f"{k} {cfg[k]!r} (diffusers: {v!r})" for k, v in _FIXED.items() if k in cfg and cfg[k] != v]
    if wrong:
        raise FarmError(
            f"weights at {where}: an LTX-Video VAE with {', '.join(wrong)} is not one diffusers' "
            "AutoencoderKLLTXVideo computes; farm cannot decode it as ltx-video would"
        )
    scalars = {key: kind(cfg[name]) for key, name, kind in _SCALARS if name in cfg}
    if listed is None:
        return scalars
    if not isinstance(listed, list) or not listed:
        raise FarmError(f"weights at {where}: the file's vae config lists no decoder_blocks (nor blocks)")
    blocks = [_block(b, where) for b in reversed(listed)]
    if blocks[0][0] != "res_x":
        raise FarmError(f"weights at {where}: decoder_blocks do not end in a res_x mid block: {listed!r}")
    channels = int(cfg["decoder_base_channels"])
    for name, params in blocks:  # as ltx-video's Decoder sizes its first convolution
        if name == "res_x_y":
            channels *= int(params.get("multiplier", 2))
        elif name.startswith("compress"):
            channels *= int(params.get("multiplier", 1))
    layers, noise = [_layers(blocks[0][1])], [bool(blocks[0][1].get("inject_noise", False))]
    out, scaling, residual, factors = [], [], [], []
    group: list[tuple[str, dict[str, Any]]] = []
    for name, params in blocks[1:]:
        group.append((name, params))
        if name != "res_x":
            continue
        names = [n for n, _ in group]
        if names not in (["res_x"], ["compress_all", "res_x"], ["res_x_y", "compress_all", "res_x"],
                         ["res_x_y", "res_x"]):  # fmt: skip
            raise FarmError(
                f"weights at {where}: decoder blocks {names} are not a group diffusers' LTX-Video up block "
                "builds ([res_x_y] [compress_all] res_x)"
            )
        settings = dict(group)
        up = settings.get("compress_all")
        factor = int(up.get("multiplier", 1)) if up is not None else 1
        if "res_x_y" in settings:
            if factor != 1:
                raise FarmError(f"weights at {where}: a res_x_y before an upsampler of multiplier {factor}")
            channels //= int(settings["res_x_y"].get("multiplier", 2))
        channels //= factor
        out.append(channels * factor)  # diffusers: a block's output = its block_out_channels / factor
        scaling.append(up is not None)
        residual.append(bool(up.get("residual", False)) if up is not None else False)
        factors.append(factor)
        layers.append(_layers(settings["res_x"]))
        noise.append(bool(settings["res_x"].get("inject_noise", False)))
        group = []
    if group:
        raise FarmError(f"weights at {where}: decoder blocks {[n for n, _ in group]} end without a res_x")
    if "latent_channels" not in scalars:
        raise FarmError(f"weights at {where}: the file's vae config has no latent_channels")
    return {
        **scalars,
        "patch_size_t": 1,
        "decoder_block_out_channels": out[::-1],
        "decoder_layers_per_block": layers[::-1],
        "decoder_spatio_temporal_scaling": scaling[::-1],
        "decoder_inject_noise": noise[::-1],
        "upsample_residual": residual[::-1],
        "upsample_factor": factors[::-1],
    }


def _layers(params: dict[str, Any]) -> int:
    return int(params.get("num_layers", 1))
