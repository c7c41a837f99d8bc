"""A decoder family is one folder whose class declares every hook farm reads: the hooks are declared, with
their defaults, on the base class (`DiffusersVideoDecoder`) and the `VideoDecoder` Protocol, and farm reads
them as plain attributes, never as ``getattr(adapter, "hook", default)`` or ``hasattr``; and no module
outside a family's folder (and the registry) treats a family apart by its name, a named config or a
checkpoint layout: no comparison, ``in`` test, match case, table keyed by it or lookup with it."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from farm.decoders import FAMILIES
from farm.decoders.base import VideoDecoder
from farm.decoders.diffusers_vae import DiffusersVideoDecoder

ROOT = Path(__file__).resolve().parents[1]
FARM = ROOT / "farm"
REGISTRIES = (FARM / "decoders" / "__init__.py", FARM / "decoders" / "sound.py")  # video and sound families
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


def adapter_like(node: ast.expr) -> bool:
    """Whether `node` reads as a decoder adapter (class or instance): ``cls``, ``decoder``, ``adapter``, …"""
    text = ast.unparse(node)
    return text == "cls" or "decoder" in text.lower() or "adapter" in text.lower()


def named_read(node: ast.AST) -> tuple[str, ast.expr, str, bool] | None:
    """A call such as ``getattr(x, "name", default)`` / ``hasattr(x, "name")`` as (function, ``x``, the
    name, whether a default is given), or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
        name = node.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str):
            return node.func.id, node.args[0], name.value, len(node.args) == 3
    return None


def outside_decoders(path: Path) -> bool:
    return FARM / "decoders" not in path.parents


def test_no_adapter_hook_is_read_with_a_default():
    """``getattr(adapter, "hook", default)`` / ``hasattr(adapter, "hook")``: a hook some adapters lack. Caught
    by the hook's name (any adapter's attribute: getattr anywhere in farm/, hasattr outside farm/decoders/)
    or, outside farm/decoders/ (where diffusers' models are read so), by what it is read from."""
    names = adapter_names()
    found = []
    for path, tree in sources():
        for node in ast.walk(tree):
            read = named_read(node)
            if read is None:
                continue
            function, owner, name, default = read
            outside = outside_decoders(path)
            if not ((function == "getattr" and default) or (function == "hasattr" and outside)):
                continue  # (inside farm/decoders/, hasattr asks diffusers' classes what they have)
            if name in names or (outside and adapter_like(owner)):
                found.append(f"{path.relative_to(ROOT)}:{owner.lineno} {function} {name!r}")
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


LAYOUT = re.compile(r"[a-z0-9.]+-original")


def layout_names() -> set[str]:
    """Every family's original checkpoint layouts: the ``*-original`` names its folder's code spells."""
    nodes = [node for cls in FAMILIES.values() for _, tree in family_sources(cls) for node in ast.walk(tree)]
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and LAYOUT.fullmatch(n.value)}  # fmt: skip


def family_sources(cls: type) -> list[tuple[Path, ast.Module]]:
    home = family_home(cls)
    files = sorted(home.rglob("*.py")) if home.is_dir() else [home]
    return [(path, ast.parse(path.read_text(), str(path))) for path in files]


def family_words() -> set[str]:
    """The names code would branch on to treat one family apart: every registered family's name, its named
    configs (and the sound configs that go with them) and its original layouts. "diffusers" names a family
    (any diffusers video VAE) and diffusers' own checkpoint layout, which every family reads: it is the
    layout's."""
    words = set(FAMILIES) | layout_names()
    for cls in FAMILIES.values():
        words |= set(cls.named_configs) | set(cls.sound_configs.values())
    return words - {"diffusers"}


def constants(node: ast.AST | None) -> list[ast.Constant]:
    """The string constants `node` is or holds as a literal tuple, list or set (or a match pattern's)."""
    if isinstance(node, SEQUENCES):
        return [c for e in node.elts for c in constants(e)]
    if isinstance(node, ast.MatchValue):
        return constants(node.value)
    if isinstance(node, ast.MatchOr):
        return [c for p in node.patterns for c in constants(p)]
    return [node] if isinstance(node, ast.Constant) and isinstance(node.value, str) else []


def dispatch_on_names(tree: ast.AST, words: set[str]) -> list[tuple[int, str]]:
    """Where `tree` treats a family apart by one of `words`: a comparison or ``in`` test, a match case, a
    dict key (a table keyed by family), a subscript or ``.get``/``.pop`` with it (a lookup by family)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            named, what = [node.left, *node.comparators], "compares with"
        elif isinstance(node, ast.match_case):
            named, what = [node.pattern], "matches"
        elif isinstance(node, ast.Dict):
            named, what = list(node.keys), "keys a table by"
        elif isinstance(node, ast.Subscript):
            named, what = [node.slice], "looks up"
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and node.args):  # fmt: skip
            named, what = [node.args[0]], "looks up"
        else:
            continue
        hits = sorted({c.value for n in named for c in constants(n) if c.value in words})
        if hits:
            found.append((getattr(node, "lineno", None) or node.pattern.lineno, f"{what} {hits}"))
    return found


def test_no_code_outside_a_family_folder_branches_on_its_name_or_layouts():
    """A family's name, named configs and layouts belong in the family's folder (its class's hooks): no
    other module of farm/ compares with them, matches them, keys a table or looks anything up by them."""
    words = family_words()
    assert {"allegro", "allegro-tiny", "ltx2.3", "ltx-original", "wan22-original", "ltx2-audio"} <= words
    homes = {family_home(cls) for cls in FAMILIES.values()}
    found = []
    for path, tree in sources():
        if any(home in path.parents or path == home for home in homes) or path in REGISTRIES:
            continue  # a family's own code, and the registry
        found += [f"{path.relative_to(ROOT)}:{line} {what}" for line, what in dispatch_on_names(tree, words)]
    assert not found, "move these into a hook on the family's class: " + "; ".join(found)
