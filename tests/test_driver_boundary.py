"""The driver/worker boundary: farm's driver (the CLI, `farm plan`, `farm status`, the render client)
never imports torch or diffusers. Workers decode; the driver reads, plans, checks and submits, so a
one-shot render does not pay for imports it does not use.

Each command runs in a child process through a wrapper that records, after the command returns, which
of torch and diffusers that process (the driver) has loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from farm.inputs.synthetic import synth

pytestmark = pytest.mark.slow

HEAVY = ("torch", "diffusers")

DRIVER = f"""
import json, sys
if __name__ == "__main__":
    from farm.cli import main
    code = main(sys.argv[2:])
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(m for m in {HEAVY!r} if m in sys.modules), f)
    sys.exit(code)
"""


def run_driver(tmp_path: Path, *args: str, log: list[str] | None = None) -> list[str]:
    """Run ``farm ARGS`` as a driver process; the heavy modules it loaded (asserting it succeeded).
    Its stderr is appended to `log` when given."""
    record = tmp_path / f"modules-{len(list(tmp_path.glob('modules-*')))}.json"
    done = subprocess.run([sys.executable, "-c", DRIVER, str(record), *args], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    if log is not None:
        log.append(done.stderr)
    return json.loads(record.read_text())


@pytest.fixture(scope="module")
def weights_job(tmp_path_factory) -> Path:
    """An ltx2-tiny job whose decoder weights come from a diffusers folder (saved in a child process,
    so this test's process stays as light as the drivers it checks)."""
    root = tmp_path_factory.mktemp("weights-job")
    save = (
        "import torch\nfrom diffusers import AutoencoderKLLTX2Video\n"
        "from farm.decoders.ltx2 import LTX2_TINY\ntorch.manual_seed(0)\n"
        f"AutoencoderKLLTX2Video(**LTX2_TINY).save_pretrained({str(root / 'vae')!r})\n"
    )
    subprocess.run([sys.executable, "-c", save], check=True, timeout=300)
    synth(root / "job.zarr", decoder="ltx2-tiny", frames=17, height=64, width=96, weights=str(root / "vae"))
    return root / "job.zarr"


def test_plan_imports_neither(weights_job, tmp_path):
    assert run_driver(tmp_path, "plan", str(weights_job)) == []


def test_render_into_a_running_cluster_imports_neither(weights_job, scheduler3, tmp_path):
    out = tmp_path / "out"
    into_cluster = ("--out", str(out), "--scheduler", scheduler3)
    assert run_driver(tmp_path, "render", str(weights_job), *into_cluster) == []
    assert run_driver(tmp_path, "status", str(out)) == []
    assert (out / "videos" / "shot000.mp4").exists()


def test_render_with_its_own_cluster_imports_neither(weights_job, tmp_path):
    """The local cluster's scheduler runs in the driver's process: it must not load torch either. With
    ``-v`` the render logs what its worker spent on its decoder and its first decode."""
    out, log = tmp_path / "out", []
    own_cluster = ("--out", str(out), "--workers", "1")
    assert run_driver(tmp_path, "-v", "render", str(weights_job), *own_cluster, log=log) == []
    assert (out / "videos" / "shot000.mp4").exists()
    worker_line = next(line for line in log[0].splitlines() if " worker tcp://" in line)
    assert "decoder ready" in worker_line and "first decode eager" in worker_line, log[0]
