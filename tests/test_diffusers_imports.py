"""A decode worker imports diffusers' model code as if transformers and peft were not installed
(`farm.worker.diffusers_imports`): the class imports without them, and decodes the same bytes."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from farm.worker.diffusers_imports import EAGER_PACKAGES, UNUSED_PACKAGES

# a fresh interpreter: told (or not) that transformers and peft are absent, it imports the LTX-2 class,
# decodes a seeded tiny latent and says which of the unused packages' modules it imported
DECODE = """
import hashlib, json, sys
from farm.worker.diffusers_imports import import_without_unused_packages
from farm.worker.diffusers_imports import defer_package_inits
told = import_without_unused_packages() if sys.argv[1] != "plain" else False
deferred = defer_package_inits() if sys.argv[1] == "deferred" else False
import torch
from diffusers import AutoencoderKLLTX2Video
from farm.decoders import spec_from_json
config = spec_from_json({"family": "ltx2", "config": "ltx2-tiny", "weights": {"random_seed": 3}}).config
torch.manual_seed(3)
vae = AutoencoderKLLTX2Video(**config).eval()
latent = torch.randn(1, config["latent_channels"], 3, 4, 6, generator=torch.Generator().manual_seed(4))
with torch.no_grad():
    frames = vae.decode(latent).sample
imported = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("transformers", "peft")})
registry = "transformers.models.auto" in sys.modules
digest = hashlib.sha256(frames.numpy().tobytes()).hexdigest()
# models of the three kinds that the class does not use
others = ["diffusers.models.autoencoders.autoencoder_kl_wan", "diffusers.models.unets.unet_2d_condition",
          "diffusers.models.transformers.transformer_flux"]
print(json.dumps([told, imported, registry, list(frames.shape), digest, deferred,
                  [m for m in others if m in sys.modules]]))
"""


def _decode(mode: str) -> list:
    run = subprocess.run([sys.executable, "-c", DECODE, mode], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_a_decode_worker_imports_the_vae_without_transformers_registry_and_decodes_the_same_bytes():
    told, imported, registry, shape, digest, _, _ = _decode("lean")
    assert told is True
    assert not registry  # transformers' model registry, the bulk of its import, stays out
    assert "peft" not in imported
    plain_told, plain_imported, plain_registry, plain_shape, plain_digest, _, others = _decode("plain")
    assert len(others) == 3  # as installed, each package's __init__ imports every model of its kind
    assert plain_told is False
    if importlib.util.find_spec("transformers") is not None:  # installed: imported as installed
        assert plain_registry, plain_imported
    if importlib.util.find_spec("peft") is not None:
        assert "peft" in plain_imported
    assert (shape, digest) == (plain_shape, plain_digest)


def test_a_decode_worker_imports_the_class_module_alone_and_decodes_the_same_bytes():
    *_, plain_shape, plain_digest, _, _ = _decode("plain")
    told, imported, registry, shape, digest, deferred, others = _decode("deferred")
    assert deferred is True
    assert others == []  # no other autoencoder, UNet or transformer came with the class
    assert (shape, digest) == (plain_shape, plain_digest)


# with the packages' __init__ deferred: every family's class imports, and what a package's __init__ names
# is there when asked for (the __init__ then runs, once)
NAMES = """
import json, sys
from farm.worker.diffusers_imports import EAGER_PACKAGES, defer_package_inits
deferred = defer_package_inits()
from farm.decoders import FAMILIES
classes = sorted(cls.model_class().__name__ for cls in FAMILIES.values() if cls.model_class_name)
ran_before = [name for name in EAGER_PACKAGES if "__getattr__" not in vars(sys.modules[name])]
from diffusers.models.autoencoders import AutoencoderKLWan
from diffusers.models.transformers import Transformer2DModel
import diffusers.models.unets as unets
star = {}
exec("from diffusers.models.unets import *", star)
asked = [AutoencoderKLWan.__name__, Transformer2DModel.__name__, star["UNet2DConditionModel"].__name__,
         unets.UNet2DConditionModel.__name__]
ran_after = [name for name in EAGER_PACKAGES if "__getattr__" not in vars(sys.modules[name])]
try:
    unets.NoSuchModel
    missing = None
except AttributeError as exc:
    missing = str(exc)
print(json.dumps([deferred, classes, ran_before, asked, ran_after, missing]))
"""


def test_a_deferred_package_gives_every_name_its_init_defines_when_asked():
    run = subprocess.run([sys.executable, "-c", NAMES], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    deferred, classes, ran_before, asked, ran_after, missing = json.loads(run.stdout.splitlines()[-1])
    assert deferred is True
    assert "AutoencoderKLLTX2Video" in classes and "AutoencoderKLWan" in classes and len(classes) >= 10
    assert ran_before == []  # the classes' own modules imported, no package's __init__ ran
    assert asked == ["AutoencoderKLWan", "Transformer2DModel", "UNet2DConditionModel", "UNet2DConditionModel"]
    assert ran_after == list(EAGER_PACKAGES)
    assert missing is not None and "NoSuchModel" in missing


def test_once_diffusers_model_code_is_imported_nothing_changes():
    code = ("import json, diffusers.models.modeling_utils; from diffusers.utils import import_utils as u; "
            "from farm.worker.diffusers_imports import import_without_unused_packages as f; "
            "asked = lambda: [u.is_transformers_available(), u.is_peft_available()]; before = asked(); "
            "print(json.dumps([f(), before == asked()]))")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout) == [False, True]


def test_the_packages_it_hides_are_the_ones_diffusers_asks_about():
    import diffusers.utils.import_utils as import_utils

    for name in UNUSED_PACKAGES:
        assert isinstance(getattr(import_utils, f"_{name}_available"), bool), name
        assert callable(getattr(import_utils, f"is_{name}_available")), name


# the worker forkserver's imports, then the LTX-2 class as a forked worker's build imports it; afterwards
# transformers imports as installed
SERVER = """
import importlib.util, json, sys
from farm.run.forkserver_imports import DECODER_MODULES, import_decoder_code
done = import_decoder_code()
from diffusers import AutoencoderKLLTX2Video
hidden = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("transformers", "peft")})
finders = [type(f).__name__ for f in sys.meta_path]
after = None
if importlib.util.find_spec("transformers") is not None:
    import transformers.models.auto
    after = "transformers.models.auto" in sys.modules
print(json.dumps([done == list(DECODER_MODULES), hidden, "_Hidden" in finders, after]))
"""


def test_the_forkserver_imports_diffusers_model_code_with_neither_package():
    run = subprocess.run([sys.executable, "-c", SERVER], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    all_done, imported, finder_left, after = json.loads(run.stdout.splitlines()[-1])
    assert all_done
    assert imported == []  # not even transformers' package: diffusers' outright import of it found it absent
    assert not finder_left
    assert after in (None, True)  # the block over, transformers imports as installed
