"""The LTX-2 family (LTX-2 2.0 and LTX-2.3): its video adapter (`adapter`), named configs (`configs`),
Lightricks' single-file metadata as ltx-core reads it (`metadata`), the carried causal state (`carry`),
and its sound: the audio VAE and vocoder (`audio`, `audio_vae_config`, `vocoder_config`)."""

from farm.decoders.ltx2.adapter import LTX2Decoder
from farm.decoders.ltx2.configs import LTX2_3, LTX2_3_TINY, LTX2_RELEASED, LTX2_TINY

__all__ = ["LTX2Decoder", "LTX2_RELEASED", "LTX2_TINY", "LTX2_3", "LTX2_3_TINY"]
