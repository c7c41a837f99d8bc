"""`farm plan`'s memory per tile against a measured peak: real decodes of tiny configs on this CPU.

`workflows/measure_families.py` decodes a clip in a fresh process and reports the peak memory above what
the process held before the decode, next to the adapter's estimate (what `farm plan` prints, less the
weights). The clip here is not the one the adapters' figures were measured at, so the linear model is
checked, not only the recorded number. (HunyuanVideo-tiny's peak on a CPU is not linear in the clip: its
adapter keeps the larger of two measured figures; Wan-tiny's decode is too slow for this test.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_planned_memory_is_within_20_percent_of_the_measured_peak(tmp_path):
    out = tmp_path / "families.json"
    subprocess.run(
        [sys.executable, str(ROOT / "workflows" / "measure_families.py"), "--decoders",
         "ltx2-tiny,ltxv-tiny", "--clip", "25,160,224", "--reps", "0", "--out-json", str(out)],
        check=True, cwd=ROOT, capture_output=True, timeout=600,
    )  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [r["decoder"] for r in rows] == ["ltx2-tiny", "ltxv-tiny"]
    for r in rows:
        assert r["pixels"] == [25, 160, 224]
        assert 0.8 <= r["estimated_peak_bytes"] / r["measured_peak_bytes"] <= 1.2, r
