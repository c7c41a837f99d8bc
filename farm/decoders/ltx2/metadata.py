"""The decoder config Lightricks' single files carry, read as ltx-core reads it, in diffusers' terms.

LTX checkpoints (LTX-2's full file, its VAE-only files, LTX-Video 0.9.x) hold their model config as JSON
in the safetensors metadata: ``__metadata__["config"]`` → ``"vae"``, with ltx-core's keys
(``decoder_blocks``, ``causal_decoder``, ``spatial_padding_mode``, ``timestep_conditioning``,
``decoder_base_channels``, ``latent_channels``, ``patch_size``, ``norm_layer``). ltx-core builds its
decoder from exactly these (`ltx_core/model/video_vae/model_configurator.py`), with its own defaults for
missing keys; :func:`ltx2_decoder_config` turns them into the constructor arguments of diffusers'
``AutoencoderKLLTX2Video`` that shape its decoder, so that a job's config can be checked against the file
it decodes. Pure: JSON in, a dict out; no torch.
"""

from __future__ import annotations

from typing import Any

from farm.errors import FarmError

# ltx-core's defaults for keys a file's `vae` config leaves out (VideoDecoderConfigurator.from_config)
LTX_CORE_DECODER_DEFAULTS: dict[str, Any] = {
    "latent_channels": 128,
    "spatial_padding_mode": "reflect",
    "out_channels": 3,
    "patch_size": 4,
    "norm_layer": "pixel_norm",
    "causal_decoder": False,
    "timestep_conditioning": True,
    "decoder_base_channels": 128,
    "dims": 3,
}
# ltx-core's upsampling blocks → diffusers' upsample_type
_UPSAMPLERS = {"compress_all": "spatiotemporal", "compress_time": "temporal", "compress_space": "spatial"}
# the diffusers keys that decide what the decoder computes (the encoder's are not compared)
DECODER_KEYS = (
    "latent_channels", "out_channels", "decoder_block_out_channels", "decoder_layers_per_block",
    "decoder_spatio_temporal_scaling", "decoder_inject_noise", "upsample_type", "upsample_residual",
    "upsample_factor", "timestep_conditioning", "patch_size", "patch_size_t", "decoder_causal",
    "decoder_spatial_padding_mode",
)  # fmt: skip


def ltx2_decoder_config(vae: dict[str, Any], where: str) -> dict[str, Any]:
    """ltx-core's ``vae`` config → the decoder's constructor arguments of diffusers'
    ``AutoencoderKLLTX2Video`` (:data:`DECODER_KEYS`; without ``decoder_blocks``, the settings besides the
    blocks, whose shapes the weight check compares anyway).

    ltx-core lists ``decoder_blocks`` encoder-wise and builds them reversed: the first block it builds is
    the mid block (``res_x``), then each upsampler (``compress_*``, dividing the channels by its
    ``multiplier``) with the ``res_x`` group after it. diffusers keeps the channels and layer counts
    encoder-wise too (it reverses them), but the upsampler kinds in decode order.
    """
    cfg = {**LTX_CORE_DECODER_DEFAULTS, **vae}
    if cfg["norm_layer"] != "pixel_norm" or cfg["dims"] != 3:
        raise FarmError(
            f"weights at {where}: an LTX-2 video decoder with norm_layer {cfg['norm_layer']!r} and dims "
            f"{cfg['dims']!r} is not one diffusers' AutoencoderKLLTX2Video builds (pixel_norm, 3)"
        )
    scalars = {
        "latent_channels": int(cfg["latent_channels"]),
        "out_channels": int(cfg["out_channels"]),
        "timestep_conditioning": bool(cfg["timestep_conditioning"]),
        "patch_size": int(cfg["patch_size"]),
        "patch_size_t": 1,
        "decoder_causal": bool(cfg["causal_decoder"]),
        "decoder_spatial_padding_mode": str(cfg["spatial_padding_mode"]),
    }
    if "decoder_blocks" not in cfg:  # the blocks are left to the tensors' shapes
        return scalars
    blocks = [block_settings(b, where) for b in reversed(cfg["decoder_blocks"] or [])]
    if not blocks or blocks[0][0] != "res_x" or len(blocks) % 2 == 0:
        raise FarmError(
            f"weights at {where}: decoder_blocks {cfg.get('decoder_blocks')!r} is not a res_x mid block "
            "followed by (upsampler, res_x) pairs, the LTX-2 decoder's structure"
        )
    channels = int(cfg["decoder_base_channels"]) * 8  # ltx-core: three upsamplers of multiplier 2 → base
    layers = [int(blocks[0][1].get("num_layers", 1))]
    noise = [bool(blocks[0][1].get("inject_noise", False))]
    out_channels, kinds, residual, factors = [], [], [], []
    for (up, up_cfg), (res, res_cfg) in zip(blocks[1::2], blocks[2::2], strict=True):
        if up not in _UPSAMPLERS or res != "res_x":
            raise FarmError(
                f"weights at {where}: decoder block {up!r} then {res!r} where an upsampler "
                f"({', '.join(_UPSAMPLERS)}) then res_x was expected"
            )
        factor = int(up_cfg.get("multiplier", 1))
        out_channels.append(channels)  # diffusers: a block's output = its upsampler's input / factor
        channels //= factor
        kinds.append(_UPSAMPLERS[up])
        residual.append(bool(up_cfg.get("residual", False)))
        factors.append(factor)
        layers.append(int(res_cfg.get("num_layers", 1)))
        noise.append(bool(res_cfg.get("inject_noise", False)))
    return {
        **scalars,
        "decoder_block_out_channels": out_channels[::-1],
        "decoder_layers_per_block": layers[::-1],
        "decoder_spatio_temporal_scaling": [True] * len(kinds),
        "decoder_inject_noise": noise[::-1],
        "upsample_type": kinds,
        "upsample_residual": residual[::-1],
        "upsample_factor": factors[::-1],
    }


def block_settings(block: Any, where: str) -> tuple[str, dict[str, Any]]:
    """One ``decoder_blocks`` entry → (name, settings): ltx-core takes ``[name, n_layers]`` or
    ``[name, {...}]``."""
    if isinstance(block, list | tuple) and len(block) == 2 and isinstance(block[0], str):
        name, params = block
        if isinstance(params, int) and not isinstance(params, bool):
            return name, {"num_layers": params}
        if isinstance(params, dict):
            return name, params
    raise FarmError(f"weights at {where}: decoder block {block!r} is not [name, layers] or [name, {{...}}]")
