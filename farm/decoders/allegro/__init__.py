"""The Allegro family: its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.allegro.adapter import AllegroDecoder
from farm.decoders.allegro.configs import ALLEGRO_TINY

__all__ = ["AllegroDecoder", "ALLEGRO_TINY"]
