"""LTX-2's and LTX-2.3's named video VAE configs (diffusers' `AutoencoderKLLTX2Video` arguments)."""

from __future__ import annotations

# LTX-2 (2.0) as released: the video VAE config diffusers' `scripts/convert_ltx2_to_diffusers.py`
# (`get_ltx2_video_vae_config("2.0")`) writes, which is what Lightricks' ltx-core builds from the
# checkpoint's own metadata (`ltx_core/model/video_vae/model_configurator.py`: `causal_decoder` False,
# reflect padding, no timestep conditioning). diffusers' constructor defaults differ in one place that
# matters: they make the decoder causal in time, which the released model is not.
LTX2_RELEASED = {
    "latent_channels": 128,
    "block_out_channels": [256, 512, 1024, 2048],
    "decoder_block_out_channels": [256, 512, 1024],
    "layers_per_block": [4, 6, 6, 2, 2],
    "decoder_layers_per_block": [5, 5, 5, 5],
    "decoder_spatio_temporal_scaling": [True, True, True],
    "decoder_inject_noise": [False, False, False, False],
    "upsample_type": ["spatiotemporal", "spatiotemporal", "spatiotemporal"],
    "upsample_residual": [True, True, True],
    "upsample_factor": [2, 2, 2],
    "timestep_conditioning": False,
    "patch_size": 4,
    "patch_size_t": 1,
    "decoder_causal": False,
    "decoder_spatial_padding_mode": "reflect",
}

# The released structure (non-causal, reflect padding, residual spatio-temporal upsamplers, pixel norm) at
# a few channels: decodes 17x128x192 in ~0.1 s on one CPU core, through the same code paths.
LTX2_TINY = {
    **LTX2_RELEASED,
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "decoder_block_out_channels": [8, 16, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_layers_per_block": [1, 1, 1, 1],
}

# LTX-2.3's video VAE, as diffusers' conversion script writes it (`scripts/convert_ltx2_to_diffusers.py`,
# `get_ltx2_video_vae_config("2.3")`, with the script's default `timestep_conditioning=False`): four decoder
# stages, upsamplers spatiotemporal / spatiotemporal / temporal / spatial without residual (channel factors
# 2, 2, 1, 2), zero padding, not causal. Lightricks' own form (the file's `config` -> `vae`): decoder_blocks
# res_x 4, compress_space x2, res_x 6, compress_time x2, res_x 4, compress_all x1, res_x 2, compress_all x2,
# res_x 2, causal_decoder false, spatial_padding_mode zeros (ltx-core's VideoDecoder builds them reversed).
LTX2_3 = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 128,
    "block_out_channels": [256, 512, 1024, 1024],
    "down_block_types": ["LTX2VideoDownBlock3D"] * 4,
    "decoder_block_out_channels": [256, 512, 512, 1024],
    "layers_per_block": [4, 6, 4, 2, 2],
    "decoder_layers_per_block": [4, 6, 4, 2, 2],
    "spatio_temporal_scaling": [True, True, True, True],
    "decoder_spatio_temporal_scaling": [True, True, True, True],
    "decoder_inject_noise": [False, False, False, False, False],
    "downsample_type": ["spatial", "temporal", "spatiotemporal", "spatiotemporal"],
    "upsample_type": ["spatiotemporal", "spatiotemporal", "temporal", "spatial"],
    "upsample_residual": [False, False, False, False],
    "upsample_factor": [2, 2, 1, 2],
    "timestep_conditioning": False,
    "patch_size": 4, "patch_size_t": 1, "resnet_norm_eps": 1e-6,
    "encoder_causal": True, "decoder_causal": False,
    "encoder_spatial_padding_mode": "zeros", "decoder_spatial_padding_mode": "zeros",
    "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
}  # fmt: skip
# LTX-2.3's structure (stages, upsampler kinds and factors, padding, causality) at widths 1/32 of it.
LTX2_3_TINY = {
    **LTX2_3,
    "latent_channels": 8,
    "block_out_channels": [8, 16, 32, 32],
    "decoder_block_out_channels": [8, 16, 16, 32],
    "layers_per_block": [1, 1, 1, 1, 1],
    "decoder_layers_per_block": [1, 1, 1, 1, 1],
}
