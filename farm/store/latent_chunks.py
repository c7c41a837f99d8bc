"""A shot's latent read chunk by chunk, each stored chunk checked as it is read.

A render records the sha256 of every stored chunk of each shot's latent when it hashes the job
(`chunk_digests`); a worker reads latents through `CheckedChunks`, which hashes each chunk's bytes as
they are read and refuses a chunk whose bytes differ from the record (the latents were rewritten
during the render) or that is missing (Zarr would give its fill value: a missing chunk would render
as grey frames). Only the chunks a tile reads travel with its task (`LatentChunks.covering`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.errors import FarmError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from zarr.abc.store import ByteRequest
    from zarr.core.buffer import Buffer, BufferPrototype

# keys of a Zarr array's store that hold metadata, not chunks (formats 3 and 2)
METADATA_KEYS = frozenset({"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"})


@dataclass(frozen=True)
class LatentChunks:
    """The stored chunks of one shot's latent: chunk grid coordinates → (store key, sha256 of its bytes)."""

    shot: str
    chunk_shape: tuple[int, ...]
    digests: dict[tuple[int, ...], tuple[str, str]]

    def covering(self, region: Sequence[slice]) -> LatentChunks:
        """The chunks that hold any of `region` (latent frames, rows, columns; every channel)."""
        spans = [range(s.start // n, -(-s.stop // n))
                 for s, n in zip(region, self.chunk_shape[1:], strict=True)]  # fmt: skip
        wanted = {c: d for c, d in self.digests.items()
                  if all(i in r for i, r in zip(c[1:], spans, strict=True))}  # fmt: skip
        return LatentChunks(self.shot, self.chunk_shape, wanted)

    def by_key(self) -> dict[str, str]:
        return dict(self.digests.values())


def chunk_grid(arr: Any) -> list[tuple[tuple[int, ...], str]]:
    """Every chunk of a Zarr array's grid: its coordinates and its store key."""
    counts = [math.ceil(n / c) for n, c in zip(arr.shape, arr.chunks, strict=True)]
    grid = itertools.product(*map(range, counts))
    return [(coords, arr.metadata.encode_chunk_key(coords)) for coords in grid]


def missing_chunk(shot: str, key: str, where: Path | str) -> FarmError:
    return FarmError(
        f"shot {shot!r}: latent chunk {key!r} is missing from {str(where)!r} (Zarr would give zeros in its "
        "place); re-export the latents, writing every chunk (zarr's write_empty_chunks=True)"
    )


def chunk_digests(latent_dir: Path, arr: Any, shot: str) -> LatentChunks:
    """The sha256 of every stored chunk file of the latent array `arr` at `latent_dir`; a chunk of its grid
    that is not stored is refused (`missing_chunk`)."""
    digests = {}
    for coords, key in chunk_grid(arr):
        try:
            with open(latent_dir / key, "rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
        except FileNotFoundError:
            raise missing_chunk(shot, key, latent_dir) from None
        digests[coords] = (key, digest)
    return LatentChunks(shot, tuple(int(c) for c in arr.chunks), digests)


def changed_chunk(shot: str, key: str, where: Path | str) -> FarmError:
    return FarmError(
        f"shot {shot!r}: latent chunk {key!r} in {str(where)!r} changed since this render hashed the job; "
        "nothing was decoded from it: render again once the latents stay as they are"
    )


def check_read(seen: dict[str, str], expected: LatentChunks, where: Path | str) -> None:
    """Refuse chunks read (store key → sha256 of the bytes read) that are not those `expected` records."""
    recorded = expected.by_key()
    for key, digest in seen.items():
        if recorded.get(key) != digest:
            raise changed_chunk(expected.shot, key, where)


def checked_store(
    latent_dir: Path, shot: str, expected: LatentChunks | None = None, seen: dict[str, str] | None = None
) -> Any:
    """A read-only store of the latent array at `latent_dir` that hashes each chunk's bytes as they are
    read (into `seen`, store key → sha256, when given) and refuses a missing chunk and, with `expected`,
    a chunk whose bytes are not those recorded."""
    from zarr.storage import LocalStore, WrapperStore

    class CheckedChunks(WrapperStore[LocalStore]):
        async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None
                      ) -> Buffer | None:  # fmt: skip
            data = await self._store.get(key, prototype, byte_range)
            if key.rsplit("/", 1)[-1] in METADATA_KEYS:
                return data
            if data is None:
                raise missing_chunk(shot, key, latent_dir)
            if byte_range is not None:  # farm's latents are never sharded: a chunk is read whole
                raise FarmError(f"shot {shot!r}: latent chunk {key!r} was read in part; farm reads whole "
                                "chunks (store the latent without sharding)")  # fmt: skip
            if seen is None and recorded is None:
                return data
            # off the event loop: zarr's other chunk reads go on meanwhile (sha256 releases the GIL)
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data.to_bytes()).hexdigest())
            if seen is not None:
                seen[key] = digest
            if recorded is not None and recorded.get(key) != digest:
                raise changed_chunk(shot, key, latent_dir)
            return data

    recorded = None if expected is None else expected.by_key()
    return CheckedChunks(LocalStore(latent_dir, read_only=True))
