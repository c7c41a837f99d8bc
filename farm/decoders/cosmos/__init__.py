"""The Cosmos 1.0 family: its adapter (`adapter`) and named configs (`configs`)."""

from farm.decoders.cosmos.adapter import CosmosDecoder
from farm.decoders.cosmos.configs import COSMOS_TINY

__all__ = ["CosmosDecoder", "COSMOS_TINY"]
