"""LTX-Video 0.9.x's named VAE configs (diffusers' `AutoencoderKLLTXVideo` arguments)."""

from __future__ import annotations

# The released VAEs, from diffusers' `scripts/convert_ltx_to_diffusers.py` (`get_vae_config("0.9.0")`,
# "0.9.1", "0.9.5"): the single files' `config` -> `vae` metadata in diffusers' terms. Lightricks'
# `ltx-video` 0.1.2 builds its `CausalVideoAutoencoder` from that metadata; built from the released
# block lists, its decoder has the same tensor names and shapes as each config here (docs/decoders.md).
# All three: not causal in time (`causal_decoder: false`), zero spatial padding (no release sets
# `spatial_padding_mode`; zeros is ltx-video's default and the only mode diffusers' class has), pixel
# norm, per-channel latent statistics carried by the file. 0.9.0 is diffusers' default constructor, so
# "ltxv" is the empty config. A file's own metadata is checked against the job's config
# (`check_file_config`, `farm.decoders.ltxv.metadata`).
LTXV_091 = {
    "decoder_block_out_channels": [256, 512, 1024],
    "decoder_layers_per_block": [5, 6, 7, 8],
    "decoder_spatio_temporal_scaling": [True, True, True],
    "decoder_inject_noise": [True, True, True, False],
    "upsample_residual": [True, True, True],
    "upsample_factor": [2, 2, 2],
    "timestep_conditioning": True,
}
LTXV_095 = {
    "block_out_channels": [128, 256, 512, 1024, 2048],
    "down_block_types": ["LTXVideo095DownBlock3D"] * 4,
    "layers_per_block": [4, 6, 6, 2, 2],
    "spatio_temporal_scaling": [True, True, True, True],
    "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
    "decoder_block_out_channels": [256, 512, 1024],
    "decoder_layers_per_block": [5, 5, 5, 5],
    "decoder_spatio_temporal_scaling": [True, True, True],
    "decoder_inject_noise": [False, False, False, False],
    "upsample_residual": [True, True, True],
    "upsample_factor": [2, 2, 2],
    "timestep_conditioning": True,
    "spatial_compression_ratio": 32,
    "temporal_compression_ratio": 8,
}
# Same classes, a few channels, one layer per block: the 0.9.0 structure, the 0.9.1 one (timestep,
# injected noise, residual upsamplers) and the 0.9.5 one (timestep, residual upsamplers, no noise).
LTXV_TINY = {
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "decoder_block_out_channels": [8, 16, 32, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_layers_per_block": [1, 1, 1, 1, 1],
}
LTXV_091_TINY = {
    **LTXV_091,
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_block_out_channels": [16, 32, 64],
    "decoder_layers_per_block": [1, 1, 1, 1],
}
LTXV_095_TINY = {
    **LTXV_095,
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 64, 128],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_block_out_channels": [16, 32, 64],
    "decoder_layers_per_block": [1, 1, 1, 1],
}
