"""The ``diffusers`` family: a diffusers video VAE farm has no family for, named by its class (`adapter`)."""

from farm.decoders.any_diffusers.adapter import AnyDiffusersDecoder

__all__ = ["AnyDiffusersDecoder"]
