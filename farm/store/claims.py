"""Refuse a latent by what its metadata claims, before reading its data: the shape, the chunk shape
and the size each compressed chunk says it unpacks to are checked against stated maxima and against
each other, so no read, hash or plan allocates memory in proportion to a claim.

- `shape_problem`: a shot's declared latent within `MAX_LATENT_FRAMES`, `MAX_LATENT_SIDE` and
  `MAX_LATENT_BYTES`, and chunks that hold no more than the array (beyond a small floor).
- `file_claim_problem`: a latent file's whole tensor (all its shots) within `MAX_LATENT_BYTES` too.
- `check_chunk_files`: every stored chunk's compressed frame declares at most its chunk's bytes (zstd's
  frame content size, blosc's header), read from the first bytes of each file; a compressor whose
  unpacked size cannot be read from its header is refused by name.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from farm.errors import FarmError

# A shot's latent at most: 16,384 latent frames (LTX-2's 8 frames each: 131,072 frames, 91 minutes at
# 24 fps), 2,048 latent rows or columns (16,384 pixels at 8x), and 4 GiB (a render hashes a shot's
# whole latent in memory before it starts).
MAX_LATENT_FRAMES = 16_384
MAX_LATENT_SIDE = 2_048
MAX_LATENT_BYTES = 4 * 2**30
# Chunks may be larger than a small array (writers round up), never beyond this or the array's bytes.
CHUNK_BYTES_FLOOR = 16 * 2**20
# Compressors whose unpacked size is in their header (checked here), and codecs that change no size.
BOUNDED = {"zstd", "blosc"}
SIZE_KEEPING = {"bytes", "crc32c", "transpose", "endian"}


def human(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def shape_problem(shape: Sequence[int], chunks: Sequence[int] | None, itemsize: int) -> str | None:
    """What is wrong with a latent ``[C, F, H, W]`` that declares `shape` and `chunks` (None: fine)."""
    if len(shape) != 4:
        return None  # the rank is checked by its own rule (farm.planning.jobplan.check_shots)
    frames, height, width = shape[1:]
    if frames > MAX_LATENT_FRAMES:
        return f"latent claims {frames} latent frames; farm renders at most {MAX_LATENT_FRAMES} per shot"
    if max(height, width) > MAX_LATENT_SIDE:
        return (f"latent claims {height}x{width} latent rows and columns; farm renders at most "
                f"{MAX_LATENT_SIDE} of each")  # fmt: skip
    size = math.prod(shape) * itemsize
    if size > MAX_LATENT_BYTES:
        return (
            f"latent claims {human(size)}; farm renders at most {human(MAX_LATENT_BYTES)} of latent per shot"
        )
    if chunks is not None:
        chunk = math.prod(chunks) * itemsize
        if chunk > max(size, CHUNK_BYTES_FLOOR):
            return (
                f"latent declares chunks of {tuple(chunks)} ({human(chunk)}), more than the array "
                f"{tuple(shape)} holds ({human(size)}); rewrite it with chunks within its shape"
            )
    return None


def file_claim_problem(shape: Sequence[int], itemsize: int) -> str | None:
    """What is wrong with a latent file whose tensor claims `shape` (every shot of it: ``[B, C, F, H, W]``
    or ``[C, F, H, W]``) of `itemsize` bytes each, read whole before it is split (None: fine)."""
    size = math.prod(shape) * itemsize
    if size > MAX_LATENT_BYTES:
        return (f"its latent tensor {tuple(shape)} claims {human(size)}; farm reads at most "
                f"{human(MAX_LATENT_BYTES)} of latent per file (and per shot): split it into "
                "files")  # fmt: skip
    return None


def array_chunk_bytes(arr: Any) -> int:
    """Bytes of one chunk of a Zarr array, unpacked."""
    return math.prod(arr.chunks) * arr.dtype.itemsize


def codec_names(arr: Any) -> list[str]:
    """The names of a Zarr array's codecs ("bytes", "zstd", ...), format 3 or 2."""
    meta = arr.metadata
    if hasattr(meta, "codecs"):
        return [str(c.to_dict().get("name", type(c).__name__)) for c in meta.codecs]
    compressor = [] if meta.compressor is None else [str(getattr(meta.compressor, "codec_id", ""))]
    return ["bytes", *compressor, *(str(getattr(f, "codec_id", "")) for f in meta.filters or ())]


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
NOT_A_FRAME = -1  # `declared_unpacked_size` of bytes that are no compressed frame at all


def declared_unpacked_size(head: bytes, codec: str) -> int | None:
    """The bytes a compressed chunk says it unpacks to: None when it does not say (a zstd frame without
    its content size, a skippable frame), `NOT_A_FRAME` for bytes that are not the codec's (a damaged
    chunk: its decoder fails on it without unpacking anything, and the read names it)."""
    if codec == "blosc":
        return struct.unpack_from("<I", head, 4)[0] if len(head) >= 16 else NOT_A_FRAME
    if len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:  # zstd skippable frame
        return None
    if len(head) < 6 or head[:4] != ZSTD_MAGIC:
        return NOT_A_FRAME
    descriptor = head[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0 or len(head) < at + width:
        return None
    value = int.from_bytes(head[at : at + width], "little")
    return value + 256 if width == 2 else value


def check_chunk_files(latent_dir: Path, names: Sequence[str], chunk_bytes: int, shot: str) -> None:
    """Refuse a latent whose stored chunks could unpack beyond their declared chunk size: every chunk
    file's compressed frame declares its unpacked size, at most `chunk_bytes`; codecs (`names`,
    `codec_names`) that cannot say are refused by name. Reads 32 bytes per chunk file."""
    unknown = [n for n in names if n not in BOUNDED | SIZE_KEEPING]
    if unknown:
        raise FarmError(
            f"shot {shot!r}: latent uses the codec(s) {unknown}, whose unpacked size farm cannot bound "
            "before reading; store it uncompressed or with zstd or blosc (as farm ingest does)"
        )
    compressors = [n for n in names if n in BOUNDED]
    if not compressors:
        return
    if len(compressors) > 1:
        raise FarmError(
            f"shot {shot!r}: latent is compressed twice ({compressors}); store it with one compressor"
        )
    limit = chunk_bytes
    for folder, _, files in os.walk(latent_dir):
        for name in files:
            if name == "zarr.json" or name.startswith("."):
                continue
            path = Path(folder) / name
            with open(path, "rb") as fh:
                head = fh.read(32)
            size = declared_unpacked_size(head, compressors[0])
            if size == NOT_A_FRAME:
                continue
            if size is None or size > limit:
                said = "does not declare its unpacked size" if size is None else f"declares {human(size)}"
                raise FarmError(
                    f"shot {shot!r}: latent chunk {str(path)!r} ({compressors[0]}) {said} unpacked; its "
                    f"chunk holds {human(limit)}. Refused unread: re-export the latents"
                )
