"""HunyuanVideo's named VAE configs (diffusers' `AutoencoderKLHunyuanVideo` arguments)."""

from __future__ import annotations

# Same class as the real model (diffusers' default constructor = the published HunyuanVideo VAE), a few
# channels; GroupNorm needs channels divisible by norm_num_groups.
HUNYUANVIDEO_TINY = {
    "latent_channels": 4,
    "block_out_channels": [8, 16, 32, 32],
    "layers_per_block": 1,
    "norm_num_groups": 4,
}
