"""`check_in_process`, the driver's check for a fresh session: the checking process is the harness's
child, so what `reliability_guard` and the program change must be put back for the session to report,
and a verdict later than the harness's `timeout + 1` must read as "timed out". Run in a separate
interpreter: the check disables `os.kill`, `os.getcwd` and the rest while the program runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import builtins, json, os, shutil, subprocess, sys
sys.path.insert(0, "benchmarks")
from humaneval_driver import check_in_process
before = {"kill": os.kill, "getcwd": os.getcwd, "write": os.write, "rmtree": shutil.rmtree,
          "popen": subprocess.Popen, "exit": builtins.__dict__.get("exit"), "cwd": os.getcwd()}
program = sys.argv[1]
verdict = check_in_process(program, float(sys.argv[2]))
after = {"kill": os.kill, "getcwd": os.getcwd, "write": os.write, "rmtree": shutil.rmtree,
         "popen": subprocess.Popen, "exit": builtins.__dict__.get("exit"), "cwd": os.getcwd()}
print(json.dumps({"verdict": verdict, "restored": [k for k in before if before[k] is after[k] or before[k] == after[k]],
                  "resource": sys.modules.get("resource", "absent") is not None,
                  "added": hasattr(os, "planted")}))
"""


def _check(program: str, timeout: float = 1.0) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, program, str(timeout)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_what_the_guard_and_the_program_changed_is_put_back() -> None:
    program = "import os\nos.write = None\nos.planted = 1\nassert 1 + 1 == 2\n"
    outcome = _check(program)
    assert outcome["verdict"] == "passed"
    assert sorted(outcome["restored"]) == sorted(
        ["kill", "getcwd", "write", "rmtree", "popen", "exit", "cwd"]
    )
    assert outcome["resource"] is True and outcome["added"] is False


def test_a_failure_reads_as_the_harness_writes_it() -> None:
    assert _check("assert 1 == 2, 'no'\n")["verdict"] == "failed: no"


def test_a_verdict_later_than_timeout_plus_one_is_timed_out() -> None:
    # the program swallows the harness's TimeoutException and ends 1.3 s past its 0.2 s timeout: the
    # harness has killed its child by then, so no verdict it reaches counts
    program = "import time\ntry:\n    while True:\n        pass\nexcept BaseException:\n    time.sleep(1.3)\n"
    assert _check(program, timeout=0.2)["verdict"] == "timed out"


def test_an_exception_whose_str_raises_leaves_no_verdict() -> None:
    program = "class E(Exception):\n    def __str__(self):\n        raise ValueError\nraise E()\n"
    assert _check(program)["verdict"] == "timed out"
