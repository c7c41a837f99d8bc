"""A Zarr store (zarr-python 3) for OUT/frames.zarr that never follows a link: every chunk and metadata
file it writes, reads or removes is reached from OUT's root folder by `farm.media.beneath`, so a link
swapped in for a folder of the frames (a shot's group, an array, a chunk folder) fails the write in one
line instead of sending it elsewhere.

Arrays opened on it are encoded by zarr-python's own codecs: the `zarrs` pipeline writes through paths
of its own, which would follow such a link, and it takes no store but zarr's `LocalStore` by name.
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer.core import default_buffer_prototype
from zarr.storage import LocalStore

from farm.media import beneath

if TYPE_CHECKING:
    from collections.abc import Iterable

    from zarr.core.buffer import Buffer, BufferPrototype

    from farm.store.output import Output


class BeneathStore(LocalStore):
    """zarr's `LocalStore` at `root` (a folder inside `within`, OUT), reaching each file it writes, reads
    or removes from `within` down without following a link (`farm.media.beneath`)."""

    def __init__(self, root: Path | str, *, within: Path | str, read_only: bool = False) -> None:
        super().__init__(root, read_only=read_only)
        self.within = Path(within)
        beneath.parts_beneath(self.within, self.root)  # refuses a root outside `within`

    def with_read_only(self, read_only: bool = False) -> BeneathStore:
        return type(self)(self.root, within=self.within, read_only=read_only)

    def __repr__(self) -> str:
        return f"BeneathStore('{self}', within={str(self.within)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BeneathStore) and (self.root, self.within) == (other.root, other.within)

    def _path(self, key: str) -> Path:
        return self.root / key

    def _make_root(self) -> None:
        if not self.read_only:
            self.within.mkdir(parents=True, exist_ok=True)  # OUT itself, as zarr makes its store's folder
            beneath.make_folders(self.within, self.root)
        elif not self.root.exists():
            raise FileNotFoundError(errno.ENOENT, f"{self.root} does not exist", str(self.root))

    async def _open(self, *, mode: Any = None) -> None:
        await asyncio.to_thread(self._make_root)
        self._is_open = True

    def _ensure_open_sync(self) -> None:
        if not self._is_open:
            self._make_root()
            self._is_open = True

    async def clear(self) -> None:
        self._check_writable()
        await asyncio.to_thread(beneath.remove_tree, self.within, self.root)
        await asyncio.to_thread(beneath.make_folders, self.within, self.root)

    # reading -------------------------------------------------------------------------------------------

    def _read(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer | None:
        data = beneath.read_file(self.within, self._path(key))
        if data is None:
            return None
        if isinstance(byte_range, RangeByteRequest):
            data = data[byte_range.start : byte_range.end]
        elif isinstance(byte_range, OffsetByteRequest):
            data = data[byte_range.offset :]
        elif isinstance(byte_range, SuffixByteRequest):
            data = data[max(0, len(data) - byte_range.suffix) :]
        elif byte_range is not None:
            raise TypeError(f"Unexpected byte_range, got {byte_range}.")
        return prototype.buffer.from_bytes(data)

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:  # fmt: skip
        self._ensure_open_sync()
        return self._read(key, prototype or default_buffer_prototype(), byte_range)

    async def get(self, key: str, prototype: BufferPrototype | None = None,
                  byte_range: ByteRequest | None = None) -> Buffer | None:  # fmt: skip
        if not self._is_open:
            await self._open()
        return await asyncio.to_thread(self._read, key, prototype or default_buffer_prototype(), byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def exists(self, key: str) -> bool:
        def is_file() -> bool:
            path = self._path(key)
            try:
                with beneath.folder(self.within, path.parent) as fd:
                    return stat.S_ISREG(os.stat(path.name, dir_fd=fd, follow_symlinks=False).st_mode)
            except (OSError, beneath.LinkInOutput):
                return False

        return await asyncio.to_thread(is_file)

    # writing -------------------------------------------------------------------------------------------

    def _write(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        beneath.write_file(self.within, self._path(key), value.as_buffer_like(), exclusive=exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        self._ensure_open_sync()
        self._check_writable()
        self._write(key, value)

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        await asyncio.to_thread(self._write, key, value, exclusive)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        try:
            beneath.unlink(self.within, path)
        except IsADirectoryError:
            beneath.remove_tree(self.within, path)
        except OSError as exc:
            if exc.errno != errno.EISDIR:
                raise
            beneath.remove_tree(self.within, path)

    def delete_sync(self, key: str) -> None:
        self._ensure_open_sync()
        self._check_writable()
        self._delete(key)

    async def delete(self, key: str) -> None:
        self._check_writable()
        await asyncio.to_thread(self._delete, key)

    async def delete_dir(self, prefix: str) -> None:
        self._check_writable()
        await asyncio.to_thread(beneath.remove_tree, self.within, self._path(prefix))

    async def move(self, dest_root: Path | str) -> None:
        raise NotImplementedError("farm's frames are never moved as a store")


def frames_store(out: Output, *, read_only: bool = False) -> BeneathStore:
    """The store of OUT/frames.zarr, reached from OUT's root without following a link."""
    return BeneathStore(out.frames_zarr, within=out.root, read_only=read_only)
