"""A decoder family is one class that declares every hook farm reads: the hooks are declared, with their
defaults, on the base class (`DiffusersVideoDecoder`) and the `VideoDecoder` Protocol, and farm reads
them as plain attributes, never as ``getattr(adapter, "hook", default)``."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from farm.decoders import FAMILIES
from farm.decoders.base import VideoDecoder
from farm.decoders.diffusers_vae import DiffusersVideoDecoder

ROOT = Path(__file__).resolve().parents[1]
FARM = ROOT / "farm"
REGISTRY = FARM / "decoders" / "__init__.py"
SEQUENCES = (ast.Tuple, ast.Set, ast.List)


def adapter_names() -> set[str]:
    """Every attribute an adapter class has (its own and inherited), less `object`'s."""
    return {n for cls in FAMILIES.values() for n in dir(cls) if not n.startswith("__")} - set(dir(object))


def family_home(cls: type) -> Path:
    """The family's own code: its folder under farm/decoders (or its module, where it has no folder)."""
    path = Path(inspect.getfile(cls))
    return path if path.parent.name == "decoders" else path.parent


def sources(exclude: Path | None = None) -> list[tuple[Path, ast.Module]]:
    out = []
    for path in sorted(FARM.rglob("*.py")):
        if exclude is not None and (path == exclude or exclude in path.parents):
            continue
        out.append((path, ast.parse(path.read_text(), str(path))))
    return out


def options(node: ast.expr) -> bool:
    """Whether `node` is the CLI's parsed options (`args`), whose names may match an adapter's."""
    return isinstance(node, ast.Name) and node.id == "args"


def test_no_adapter_hook_is_read_with_a_default():
    names = adapter_names()
    found = []
    for path, tree in sources():
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) == 3 and isinstance(node.args[1], ast.Constant)
                    and node.args[1].value in names):  # fmt: skip
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.args[1].value!r}")
    assert not found, "declare these on DiffusersVideoDecoder and read them plainly: " + "; ".join(found)


def test_every_adapter_attribute_read_outside_its_family_is_declared_on_the_base():
    base = set(dir(DiffusersVideoDecoder)) | set(DiffusersVideoDecoder.__annotations__)
    undeclared = []
    for cls in FAMILIES.values():
        own = {n for n in vars(cls) if not n.startswith("_")} - base
        for path, tree in sources(exclude=family_home(cls)):
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in own and not options(node.value):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    undeclared.append(f"{cls.__name__}.{node.attr} read in {where}")
    assert not undeclared, "declare these on DiffusersVideoDecoder with a default: " + "; ".join(undeclared)


def test_the_protocol_declares_what_the_base_provides():
    hooks = {n for n in dir(VideoDecoder) if not n.startswith("_")} | set(VideoDecoder.__annotations__)
    provided = set(dir(DiffusersVideoDecoder)) | set(DiffusersVideoDecoder.__annotations__)
    instance = {"spec", "geometry", "latent_channels"}  # set by `DiffusersVideoDecoder.__init__`
    missing = sorted(hooks - provided - instance)
    assert not missing, f"VideoDecoder declares {missing}, which DiffusersVideoDecoder does not provide"
    for cls in FAMILIES.values():
        assert issubclass(cls, DiffusersVideoDecoder), cls


def layout_names() -> set[str]:
    """Every family's original checkpoint layouts, as their adapters name them."""
    from farm.decoders.ltx2.layout import LTX_ORIGINAL
    from farm.decoders.wan.layout import WAN22_ORIGINAL, WAN_ORIGINAL

    return {LTX_ORIGINAL, WAN_ORIGINAL, WAN22_ORIGINAL}


def test_no_code_outside_a_family_folder_branches_on_its_name_or_layouts():
    """A comparison with a family's name or one of its layouts belongs in the family's class (a hook)."""
    # "diffusers" names a family (any diffusers video VAE) and diffusers' own checkpoint layout, which every
    # family reads: a comparison with it is the layout's
    named = (set(FAMILIES) - {"diffusers"}) | layout_names()
    homes = {family_home(cls) for cls in FAMILIES.values()}
    found = []
    for path, tree in sources():
        if any(home in path.parents or path == home for home in homes) or path == REGISTRY:
            continue  # a family's own code, and the registry
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            values = [e for o in operands for e in (o.elts if isinstance(o, SEQUENCES) else [o])]
            hits = [v.value for v in values if isinstance(v, ast.Constant) and v.value in named]
            if hits:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} compares with {hits}")
    assert not found, "move these into a hook on the family's class: " + "; ".join(found)
