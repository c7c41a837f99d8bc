"""The LTX-2.5 diffusion decoder family (`ltx2-diffusion`): its adapter (`adapter`), named configs
(`configs`), its neighbourhood attention (`neighborhood_attention`) and the code that decodes on a device
(`device`, imported only inside the functions that decode)."""

from farm.decoders.ltx2_diffusion.adapter import LTX2DiffusionDecoder
from farm.decoders.ltx2_diffusion.configs import LTX2_DIFFUSION_TINY

__all__ = ["LTX2DiffusionDecoder", "LTX2_DIFFUSION_TINY"]
