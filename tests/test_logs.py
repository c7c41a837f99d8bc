"""What `farm -v` reports of a process's own clock (`farm.logs.process_age_s`): the seconds since the
process started, counted by the kernel, so the interpreter's start and the imports before any farm code
runs are counted too."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from farm.logs import process_age_s

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read from Linux's /proc")


def test_a_process_age_counts_from_its_start():
    code = "import time; time.sleep(0.5); from farm.logs import process_age_s; print(process_age_s())"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert 0.5 <= float(run.stdout) < 30  # the sleep and the interpreter's start before it

    before = process_age_s()
    time.sleep(0.2)
    after = process_age_s()
    assert before is not None and after is not None and after - before >= 0.15
