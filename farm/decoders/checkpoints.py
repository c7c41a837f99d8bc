"""Decoder checkpoints as users hold them: their files, what they hold, their layout, their identity.

Everything here reads file headers only and imports neither torch nor diffusers, so the driver (synth,
ingest, render) checks weights in milliseconds:

* files: a diffusers folder (``*.safetensors``), one ``.safetensors`` file, or a torch pickle
  (``.pt``/``.pth``: Wan 2.1's ``Wan2.1_VAE.pth``, HunyuanVideo's ``{"state_dict": ...}``); a pickle's
  tensor names and shapes come from its ``data.pkl`` read by a restricted unpickler that builds no
  tensor and imports nothing;
* layouts, told apart by the names (:func:`detect_layout`): ``diffusers`` (what ``save_pretrained``
  writes), or one of a family's original layouts, which its adapter recognises (``original_layout``) and
  names (``original_name``, the inverse of diffusers' converters for the decoder's tensors; the workers
  convert with diffusers' own converters, ``convert_names``, and the tests check both directions agree).
  The families' own code says what each layout is (``farm/decoders/<family>/layout.py``);
* :func:`content_identity`: sizes, safetensors headers and sampled bytes, hashed, so a render notices
  weights that changed since its job was made (a few dozen small reads per file, whatever its size).
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import zipfile
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from farm.errors import FarmError

SAFETENSORS_SUFFIX = ".safetensors"
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
# A file's LTX-2 (or LTX-Video) video VAE sits under this prefix in the full checkpoints.
VAE_PREFIX = "vae."
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_MAX_HEADER = 256 * 2**20  # a safetensors header longer than this is not one


@dataclass(frozen=True)
class TensorInfo:
    shape: tuple[int, ...]
    dtype: str  # safetensors' dtype names (F32, BF16, ...)
    file: Path


@dataclass(frozen=True)
class Layout:
    name: str  # one of LAYOUTS
    prefix: str  # "" or "vae.": what precedes the VAE's names in the file


# ---- files -------------------------------------------------------------------------------------


def weight_files(path: Path) -> list[Path]:
    """The files holding the weights at `path`: a folder's .safetensors files (sorted), or the file."""
    if not path.is_dir():
        if not path.name.endswith((SAFETENSORS_SUFFIX, *TORCH_SUFFIXES)):
            raise FarmError(
                f"weights file {str(path)!r} is neither .safetensors nor a torch checkpoint "
                f"({', '.join(TORCH_SUFFIXES)}); give a diffusers folder, a .safetensors file or a .pt/.pth"
            )
        return [path]
    files = sorted(path.glob("*" + SAFETENSORS_SUFFIX))
    if not files:
        raise FarmError(
            f"weights folder {str(path)!r} holds no .safetensors file; expected a diffusers folder "
            "(config.json + diffusion_pytorch_model.safetensors) as written by save_pretrained"
        )
    return files


def is_torch_pickle(path: Path) -> bool:
    return path.name.endswith(TORCH_SUFFIXES)


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """A .safetensors file's JSON header and its length in bytes (data starts at 8 + that length)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= min(_MAX_HEADER, path.stat().st_size - 8):
                raise ValueError(f"header length {n} does not fit the file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
    except (OSError, ValueError) as exc:
        raise FarmError(f"weights file {str(path)!r} is not a readable .safetensors file: {exc}") from None
    return header, n


def file_vae_config(path: Path, header: dict[str, Any]) -> dict[str, Any] | None:
    """The ``vae`` entry of a safetensors file's ``config`` metadata (`header`: its parsed JSON header),
    or None when the file carries none. A config that is not JSON is refused, naming the file."""
    metadata = header.get("__metadata__")
    if not isinstance(metadata, dict) or "config" not in metadata:
        return None
    try:
        config = json.loads(metadata["config"])
    except (TypeError, ValueError) as exc:
        raise FarmError(f"weights file {str(path)!r}: its 'config' metadata is not JSON ({exc})") from None
    vae = config.get("vae") if isinstance(config, dict) else None
    return vae if isinstance(vae, dict) else None


# Bytes per element of safetensors' dtypes and torch's storage types (by their names here).
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
            "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "Long": 8, "Int": 4, "Short": 2, "Char": 1, "Byte": 1,
            "Bool": 1}  # fmt: skip
# A storage may hold more than its tensors use (a view of a larger tensor), up to this much more.
STORAGE_SLACK_BYTES = 2**20


class _Storage:
    def __init__(self, dtype: str, key: str, numel: int) -> None:
        self.dtype, self.key, self.numel = dtype, key, numel
        self.used = 0  # elements its tensors reach (offset + span), the most of them
        self.expanded = 0  # elements of its largest tensor, materialised (stride 0 and overlaps expanded)


class _Tensor:
    def __init__(self, storage: _Storage, size: Iterable[int]) -> None:
        self.shape = tuple(int(s) for s in size)
        self.dtype = storage.dtype


def _rebuild_tensor(storage: _Storage, offset: int, size: Iterable[int], stride: Iterable[int] = (),
                    *_rest: Any) -> _Tensor:  # fmt: skip
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without a storage")
    tensor = _Tensor(storage, size)
    strides = [int(s) for s in stride] or [1] * len(tensor.shape)
    reach = sum((n - 1) * s for n, s in zip(tensor.shape, strides, strict=False))
    span = 0 if 0 in tensor.shape else 1 + reach
    storage.used = max(storage.used, int(offset) + span)
    storage.expanded = max(storage.expanded, math.prod(tensor.shape))
    return tensor


def _rebuild_parameter(data: _Tensor, *_rest: Any) -> _Tensor:
    return data


_STORAGE_DTYPES = {"FloatStorage": "F32", "HalfStorage": "F16", "BFloat16Storage": "BF16",
                   "DoubleStorage": "F64"}  # fmt: skip


class _HeaderUnpickler(pickle.Unpickler):
    """Unpickles a torch checkpoint's structure: tensors become their shape and dtype, nothing else is
    built and nothing is imported (anything but tensors, dicts and plain values is refused)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if (module, name) == ("torch._utils", "_rebuild_parameter"):
            return _rebuild_parameter
        if module == "torch" and name.endswith("Storage"):
            return _STORAGE_DTYPES.get(name, name.removesuffix("Storage"))
        raise pickle.UnpicklingError(f"{module}.{name} is not a tensor or a plain value")

    def persistent_load(self, pid: Any) -> _Storage:  # ('storage', storage type, key, location, numel)
        if not (isinstance(pid, tuple) and len(pid) >= 5 and isinstance(pid[4], int) and pid[4] >= 0):
            raise pickle.UnpicklingError(f"a storage reference {str(pid)[:80]} is not torch's")
        key = str(pid[2])
        if key not in self.storages:
            self.storages[key] = _Storage(str(pid[1]), key, pid[4])
        return self.storages[key]

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: dict[str, _Storage] = {}


def torch_pickle_tensors(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Names → (shape, dtype) of a ``torch.save`` file's state dict (``{"state_dict": {...}}`` or the
    dict itself), from its pickle alone: no tensor data is read."""
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            unpickler = _HeaderUnpickler(z.open(pkl))
            obj = unpickler.load()
            check_storages(path, z, pkl.removesuffix("data.pkl"), unpickler.storages)
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError,
            TypeError, AttributeError, IndexError, KeyError, RecursionError) as exc:  # fmt: skip
        # the last five: a crafted pickle calling what it names with the wrong arguments
        raise FarmError(
            f"weights file {str(path)!r} is not a torch checkpoint farm can read "
            f"({type(exc).__name__}: {str(exc)[:200] or 'no detail'}); expected a torch.save zip file of a "
            "state dict (tensors only)"
        ) from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise FarmError(f"weights file {str(path)!r} holds a {type(obj).__name__}, not a state dict")
    return {str(k): (v.shape, v.dtype) for k, v in obj.items() if isinstance(v, _Tensor)}


def check_torch_storages(path: Path) -> None:
    """`check_storages` for any ``torch.save`` zip (a latent file too: a tensor, a list or a dict of them),
    before ``torch.load`` allocates them; a file whose pickle this reader cannot follow is left to the
    loader, which refuses it in its own words."""
    try:
        with zipfile.ZipFile(path) as z:
            pkl = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            unpickler = _HeaderUnpickler(z.open(pkl))
            unpickler.load()
            storages = unpickler.storages
            check_storages(path, z, pkl.removesuffix("data.pkl"), storages)
    except (OSError, zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError,
            TypeError, AttributeError, IndexError, KeyError, RecursionError):  # fmt: skip
        return


def check_storages(path: Path, z: zipfile.ZipFile, root: str, storages: dict[str, _Storage]) -> None:
    """Every storage of a torch checkpoint is whole and no larger than its tensors use: its member
    ``<root>data/<key>`` holds its bytes (the archive not cut short), and it holds no more than its
    tensors reach (beyond `STORAGE_SLACK_BYTES`: a small file may not unpack into a large storage)."""
    size = path.stat().st_size
    for key, storage in storages.items():
        name = f"{root}data/{key}"
        try:
            info = z.getinfo(name)
        except KeyError:
            raise FarmError(f"weights file {str(path)!r}: storage {key} has no member {name!r}") from None
        need = storage.numel * ITEMSIZE.get(storage.dtype, 1)
        used = storage.used * ITEMSIZE.get(storage.dtype, 1)
        expanded = storage.expanded * ITEMSIZE.get(storage.dtype, 1)
        if expanded - need > STORAGE_SLACK_BYTES:  # a stride-0 or overlapping view: counted as torch.load
            raise FarmError(  # and every reader of it would materialise it, not as stored
                f"{str(path)!r}: storage {key} holds {need} bytes but a tensor of it expands to {expanded} "
                "bytes (a stride-0 or overlapping view, e.g. expand()); refused unread. Save the tensor "
                "itself (contiguous() or clone() before torch.save)"
            )
        if need - used > STORAGE_SLACK_BYTES:
            raise FarmError(
                f"weights file {str(path)!r}: storage {key} declares {need} bytes for tensors of {used} "
                "bytes; refused unread (a small file may not unpack into a large storage). Save the tensors "
                "themselves (clone() before torch.save)"
            )
        end = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + info.compress_size
        if info.file_size < need or end > size:
            missing = max(need - info.file_size, end - size)
            raise FarmError(
                f"weights file {str(path)!r} is cut short: {missing} bytes missing (storage {key} needs "
                f"{need} bytes, member {name!r} declares {info.file_size} and the archive is {size} bytes)"
            )


def check_safetensors_data(path: Path, header: dict[str, Any], header_bytes: int) -> None:
    """Every tensor's declared bytes lie inside the file and match its shape and dtype."""
    data = path.stat().st_size - 8 - header_bytes
    end = 0
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        offsets: list[int] = entry.get("data_offsets") or []
        shape: list[int] = entry.get("shape") or []
        valid = (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                 and 0 <= offsets[0] <= offsets[1] and isinstance(shape, list)
                 and all(isinstance(s, int) and s >= 0 for s in shape))  # fmt: skip
        if not valid:
            raise FarmError(
                f"weights file {str(path)!r}: header entry {name!r} has no valid data_offsets or shape"
            )
        itemsize = ITEMSIZE.get(str(entry.get("dtype")))
        count = 1
        for s in shape:
            count *= s
        if itemsize is not None and offsets[1] - offsets[0] != count * itemsize:
            raise FarmError(
                f"weights file {str(path)!r}: tensor {name!r} of shape {tuple(shape)} ({entry.get('dtype')}) "
                f"declares {offsets[1] - offsets[0]} bytes, not {count * itemsize}"
            )
        end = max(end, offsets[1])
    if end > data:
        raise FarmError(
            f"weights file {str(path)!r} is cut short: {end - data} bytes missing (its tensors need {end} "
            f"bytes of data after the header, the file holds {max(data, 0)})"
        )


def read_tensor_infos(files: list[Path]) -> dict[str, TensorInfo]:
    """Every tensor's shape, dtype and file, from the headers of `files`."""
    infos: dict[str, TensorInfo] = {}
    for f in files:
        if is_torch_pickle(f):
            for name, (shape, dtype) in torch_pickle_tensors(f).items():
                infos[name] = TensorInfo(shape, dtype, f)
            continue
        header, header_bytes = safetensors_header(f)
        check_safetensors_data(f, header, header_bytes)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(entry, dict) or "shape" not in entry:
                raise FarmError(f"weights file {str(f)!r}: header entry {name!r} is not a tensor")
            infos[name] = TensorInfo(tuple(int(s) for s in entry["shape"]), str(entry.get("dtype")), f)
    return infos


# ---- identity ----------------------------------------------------------------------------------

_SAMPLES = 32
_SAMPLE_BYTES = 4096


def content_identity(files: list[Path]) -> str:
    """A short hash of the weights' names, sizes, headers and 33 sampled 4 KiB blocks of each file.

    Any change of tensor names, shapes, dtypes or file sizes changes it, and so do different weights of
    the same architecture (a retrained or re-quantised checkpoint differs in every sampled block); an
    edit confined to bytes between the samples would go unnoticed. Costs ~35 reads per file: well under
    a millisecond for a 2 GiB file in the page cache, a few out of it.
    """
    digest = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        digest.update(f"{f.name}\0{size}\0".encode())
        with open(f, "rb") as fh:
            head = 8 + safetensors_header(f)[1] if f.name.endswith(SAFETENSORS_SUFFIX) else 65536
            digest.update(fh.read(head))
            for i in range(_SAMPLES + 1):
                fh.seek(max(0, min(head + (size - head) * i // _SAMPLES, size - _SAMPLE_BYTES)))
                digest.update(fh.read(_SAMPLE_BYTES))
    return digest.hexdigest()[:32]


# ---- layouts -----------------------------------------------------------------------------------


class LayoutReader(Protocol):
    """What the layout functions ask of a decoder family (its adapter class): which of its original
    layouts a checkpoint's names are in."""

    family: ClassVar[str]

    @classmethod
    def original_layout(cls, names: list[str]) -> str | None: ...


def detect_layout(
    names: Iterable[str], reader: type[LayoutReader], where: str, others: Iterable[type[LayoutReader]] = ()
) -> Layout:
    """The layout of a checkpoint holding `names`, for a decoder of the family `reader`: one of its original
    layouts (`original_layout`), else diffusers'. A layout only `others` (the other families) read is
    refused, naming them."""
    names = list(names)
    prefix = VAE_PREFIX if any(n.startswith(VAE_PREFIX + "decoder.") for n in names) else ""
    inner = [n[len(prefix) :] for n in names if n.startswith(prefix)]
    if not any(n.startswith("decoder.") for n in inner):
        raise FarmError(
            f"weights at {where} hold no decoder tensors (no name starts with 'decoder.' or "
            f"'vae.decoder.'; e.g. {names[0] if names else 'no tensors at all'!r}); give a VAE checkpoint"
        )
    own = reader.original_layout(inner)
    if own is not None:
        return Layout(own, prefix)
    theirs = {other.family: other.original_layout(inner) for other in others if other is not reader}
    foreign = next((layout for layout in theirs.values() if layout is not None), None)
    if foreign is not None:  # (a partial diffusers file is compared as one: its mismatches are named)
        readers = ", ".join(f for f, layout in theirs.items() if layout == foreign)
        raise FarmError(
            f"weights at {where} are in the {foreign} layout, which {readers} read, not the {reader.family} "
            "decoder: check the spec's family"
        )
    return Layout("diffusers", prefix)


@dataclass(frozen=True)
class Derived:
    """A tensor the decoder takes that a file holds only as part of another: rows ``part`` of three of
    `base` (a fused Q/K/V projection), scaled row by row by `gate` where a static gate sits beside it."""

    base: str
    part: int | None = None
    gate: str | None = None
