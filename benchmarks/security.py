"""Security benchmark: the attack corpus (by class) and benign snippets against each available backend.

    python -m benchmarks.security                          # every backend that works here
    python -m benchmarks.security --backend host --json    # host (namespaces) only
    python -m benchmarks.security --class imports --class files

Why it is built this way (see `benchmarks/corpus/README.md` for the corpus format):
- An attack is a complete attempt to cause an effect on the host (a file written, a secret read, a
  connection made, a forged final answer, a sandbox that does not come back), and it counts as
  contained only when that effect did not happen. How it was stopped (static check, runtime guard,
  or isolation that let it run without effect) is recorded, not scored.
- Each attack runs in a fresh session with the default `Policy()`: the protection a user gets
  without configuring anything.
- A control run executes the same attacks in a plain `python3` subprocess, outside any sandbox, and
  checks that their effects *do* happen there: an attack that is "contained" only because it is
  broken would otherwise inflate the score. Benign snippets are checked in plain Python as well.
- `host:process` is the host backend forced to its process isolation level (no namespaces), so the
  Python-level layers are measured on their own, as DESIGN.md asks ("every layer is tested on its own").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from .common import make_console, print_table, progress, publish, script_main

CORPUS = Path(__file__).resolve().parent / "corpus"
DEFAULT_TIMEOUT = 5.0
SURVIVE_GRACE = 15.0
"""Seconds past its timeout a runaway attack may take to come back before it counts as not contained."""
SECRET_ENV = "KODEAGENT_BENCH_SECRET"
BACKEND_CHOICES = ("host", "host:process", "docker", "e2b")


@dataclass(frozen=True)
class Attack:
    attack_class: str
    name: str
    effect: str
    code: str
    timeout: float = DEFAULT_TIMEOUT
    policy: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """`Policy` fields for the attack's session; empty is the default `Policy()`."""


@dataclass(frozen=True)
class Benign:
    name: str
    code: str
    expected: str
    policy: Mapping[str, Any] = field(default_factory=dict, hash=False)


EFFECTS = ("write", "read", "env", "network", "forge", "survive", "reach")
CONTROLLED = ("write", "read", "env", "network")
"""Effects whose attacks can be shown to work outside a sandbox (the others need the sandbox's API)."""


def load_corpus(directory: Path = CORPUS) -> tuple[list[Attack], list[Benign]]:
    """Every attack (class = file name) and every benign snippet; malformed entries raise ValueError."""
    attacks: list[Attack] = []
    benign: list[Benign] = []
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        for entry in data.get("attack", []):
            if entry.get("effect") not in EFFECTS:
                raise ValueError(f"{path.name}: {entry.get('name')!r} has effect {entry.get('effect')!r}")
            attacks.append(
                Attack(
                    path.stem,
                    entry["name"],
                    entry["effect"],
                    entry["code"],
                    float(entry.get("timeout", DEFAULT_TIMEOUT)),
                    _policy_fields(path, entry),
                )
            )
        for entry in data.get("benign", []):
            benign.append(
                Benign(entry["name"], entry["code"], entry["expected"], _policy_fields(path, entry))
            )
    return attacks, benign


def _policy_fields(path: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """An entry's `policy` table, checked against `Policy` now so that a typo fails the load, not a run."""
    from sandboxes import Policy

    fields = entry.get("policy", {})
    try:
        Policy(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path.name}: {entry.get('name')!r} has a bad policy: {exc}") from exc
    return dict(fields)


def make_policy(fields: Mapping[str, Any]) -> Any:
    from sandboxes import Policy

    return Policy(**fields)


# ---------------------------------------------------------------------- the things attacks aim at


class Listener:
    """A TCP listener on loopback that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port: int = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, name="security-listener", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            connection.close()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Targets:
    """A secret file, an environment secret, a victim process, a listener, and canary paths on this host."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="kodeagent-security-"))
        self.directory.chmod(0o777)  # writable by anyone: only the sandbox may stop a write
        self.file_token = secrets.token_hex(16)
        self.env_token = secrets.token_hex(16)
        self.reach_token = secrets.token_hex(16)
        self.secret_file = self.directory / "secret.txt"
        self.secret_file.write_text(self.file_token + "\n")
        self.secret_file.chmod(0o644)
        self._old_env = os.environ.get(SECRET_ENV)
        os.environ[SECRET_ENV] = self.env_token
        self.victim = subprocess.Popen(
            ["sleep", "3600"], env={SECRET_ENV: self.env_token, "PATH": "/usr/bin:/bin"}
        )
        self.listener = Listener()
        self._counter = 0

    def close(self) -> None:
        self.listener.close()
        self.victim.kill()
        self.victim.wait()
        if self._old_env is None:
            os.environ.pop(SECRET_ENV, None)
        else:
            os.environ[SECRET_ENV] = self._old_env
        shutil.rmtree(self.directory, ignore_errors=True)

    def new_canary(self) -> Path:
        self._counter += 1
        return self.directory / f"canary-{self._counter}"

    def render(self, code: str, canary: Path) -> str:
        return (
            code.replace("@CANARY@", str(canary))
            .replace("@SECRET_FILE@", str(self.secret_file))
            .replace("@PORT@", str(self.listener.port))
            .replace("@VICTIM_PID@", str(self.victim.pid))
            .replace("@REACHED@", f"({self.reach_token[::-1]!r}[::-1])")
            .replace("@STDLIB@", os.path.dirname(os.__file__))
        )

    def leaked(self, text: str, effect: str) -> bool:
        token = {"read": self.file_token, "env": self.env_token, "reach": self.reach_token}[effect]
        return token in text


@contextlib.contextmanager
def targets() -> Iterator[Targets]:
    t = Targets()
    try:
        yield t
    finally:
        t.close()


# ---------------------------------------------------------------------- running attacks in a sandbox


def _executor_options(backend: str) -> tuple[str, dict[str, Any]]:
    if backend == "host:process":
        return "host", {"isolation": "process"}
    return backend, {}


def _result_text(result: Any) -> str:
    answer = json.dumps(result.final_answer, default=str) if result.has_final_answer else ""
    return "\n".join([result.stdout, result.stderr, str(result.error or ""), answer])


def _stopped_by(result: Any) -> str:
    if result is None:
        return "did not return"
    if result.error is None:
        return "isolation (ran without effect)"
    if result.error.type == "PolicyViolation":
        return "static check"
    if result.timed_out:
        return "timeout"
    return f"runtime ({result.error.type})"


def executor_maker(backend: str) -> Callable[..., Any]:
    """Unopened executors of `backend` (a name of `BACKEND_CHOICES`), given their common options."""
    from sandboxes import open_executor
    from sandboxes.backends import backend_name

    name, options = _executor_options(backend)
    return lambda **more: open_executor(backend_name(name), **options, **more)


async def run_attack(backend: str, attack: Attack, where: Targets) -> dict[str, Any]:
    """One attack in a fresh session of `backend`; whether its effect happened and what stopped it."""
    return await attempt(executor_maker(backend), attack, where)


async def attempt(make: Callable[..., Any], attack: Attack, where: Targets) -> dict[str, Any]:
    """One attack in a fresh session of `make(timeout=..., policy=...)`; whether its effect happened
    and what stopped it. The tests run the corpus through this with each backend's executor factory.

    Besides its own effect, every attack fails when it printed the `@REACHED@` marker (it got past
    the step that matters) or when the same session cannot run `print(1)` afterwards, honestly
    answered (a crash, a hang, or a forged next reply all count). A session the backend refuses to
    open for the attack's policy (`BackendUnavailable`: the host's bare `process` level and
    `subprocess=True`) ran none of it: contained, when its effect did not happen either."""
    import anyio

    from sandboxes import BackendUnavailable

    canary = where.new_canary()
    code = where.render(attack.code, canary)
    connections = where.listener.connections
    result = None
    usable = False
    refused: str | None = None
    started = time.perf_counter()
    executor = make(timeout=attack.timeout, policy=make_policy(attack.policy))
    try:
        await executor.open()
    except BackendUnavailable as exc:  # the backend refuses the attack's policy: no code of it ran
        refused = str(exc)
    if refused is None:
        async with executor:
            with anyio.move_on_after(attack.timeout + SURVIVE_GRACE):
                result = await executor.run(code)
            if result is not None:
                with anyio.move_on_after(SURVIVE_GRACE):
                    after = await executor.run("print(1)")
                    usable = after.stdout == "1\n" and not after.has_final_answer
    elapsed = time.perf_counter() - started
    await anyio.sleep(0)  # let the listener thread count a connection that just arrived
    text = _result_text(result) if result is not None else ""
    if attack.effect == "write":
        happened = canary.exists()
    elif attack.effect in ("read", "env"):
        happened = where.leaked(text, attack.effect)
    elif attack.effect == "network":
        time.sleep(0.05)
        happened = where.listener.connections > connections
    elif attack.effect == "forge":
        happened = result is not None and result.has_final_answer
    else:
        happened = False
    reached = where.leaked(text, "reach")
    error: str | None
    if refused is not None:
        contained = not (happened or reached)
        stopped_by = "refused at open (the backend cannot bound the policy)"
        error = refused[:300]
    else:
        contained = not (happened or reached or result is None or not usable)
        stopped_by = _stopped_by(result)
        error = str(result.error)[:300] if result is not None and result.error else None
    return {
        "class": attack.attack_class,
        "name": attack.name,
        "effect": attack.effect,
        "contained": contained,
        "reached": reached,
        "usable_after": usable,
        "stopped_by": stopped_by if contained else "",
        "error": error,
        "seconds": elapsed,
    }


async def run_benign(backend: str, snippet: Benign) -> dict[str, Any]:
    return await check_benign(executor_maker(backend), snippet)


async def check_benign(make: Callable[..., Any], snippet: Benign) -> dict[str, Any]:
    """One benign snippet in a fresh session of `make(timeout=..., policy=...)`: whether it printed
    what CPython does."""
    async with make(timeout=DEFAULT_TIMEOUT, policy=make_policy(snippet.policy)) as executor:
        result = await executor.run(snippet.code)
    correct = result.ok and result.stdout == snippet.expected
    return {
        "name": snippet.name,
        "correct": correct,
        "stdout": result.stdout[:500],
        "error": str(result.error)[:300] if result.error else None,
    }


async def backend_isolation(backend: str) -> str:
    """Open one session to find out whether the backend works here and at which isolation level."""
    from sandboxes import open_executor
    from sandboxes.backends import backend_name

    name, options = _executor_options(backend)
    async with open_executor(backend_name(name), timeout=30, **options) as executor:
        await executor.run("pass")
        return executor.isolation


# ---------------------------------------------------------------------- the control: no sandbox


def control_attack(attack: Attack, where: Targets) -> bool:
    """True when the attack's effect happens in a plain interpreter (proves attack and detector work)."""
    canary = where.new_canary()
    code = where.render(attack.code, canary)
    connections = where.listener.connections
    with tempfile.TemporaryDirectory(prefix="kodeagent-control-") as cwd:
        try:
            done = subprocess.run(
                [sys.executable, "-c", code],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=15,
                stdin=subprocess.DEVNULL,
                env=dict(os.environ),
            )
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            output = str(exc.stdout or "") + str(exc.stderr or "")
    if attack.effect == "write":
        return canary.exists()
    if attack.effect == "network":
        time.sleep(0.05)
        return where.listener.connections > connections
    return where.leaked(output, attack.effect)


def control_benign(snippet: Benign) -> bool:
    with tempfile.TemporaryDirectory(prefix="kodeagent-control-") as cwd:
        done = subprocess.run(
            [sys.executable, "-c", snippet.code],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=15,
            stdin=subprocess.DEVNULL,
        )
    return done.returncode == 0 and done.stdout == snippet.expected


# ---------------------------------------------------------------------- the benchmark


def run(
    *,
    backends: Sequence[str] = ("host", "host:process"),
    classes: Sequence[str] = (),
    control: bool = True,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the corpus against each backend; return the JSON-ready result."""
    import anyio

    console = console or make_console()
    attacks, benign = load_corpus()
    if classes:
        unknown = set(classes) - {a.attack_class for a in attacks}
        if unknown:
            raise ValueError(f"unknown attack class(es): {', '.join(sorted(unknown))}")
        attacks = [a for a in attacks if a.attack_class in classes]
    result: dict[str, Any] = {
        "attacks": len(attacks),
        "benign": len(benign),
        "backends": {},
        "unavailable": {},
    }
    with targets() as where:
        if control:
            with progress(console, "control (no sandbox)", len(attacks) + len(benign)) as advance:
                effective: dict[str, bool] = {}
                for attack in attacks:
                    if attack.effect in CONTROLLED:
                        effective[f"{attack.attack_class}/{attack.name}"] = control_attack(attack, where)
                    advance(1)
                benign_ok = {}
                for snippet in benign:
                    benign_ok[snippet.name] = control_benign(snippet)
                    advance(1)
            result["control"] = {"attacks_effective": effective, "benign_correct": benign_ok}
        for backend in backends:
            try:
                isolation = anyio.run(backend_isolation, backend)
            except Exception as exc:  # noqa: BLE001 - any failure to open means "unavailable here", with why
                result["unavailable"][backend] = f"{type(exc).__name__}: {exc}"
                continue
            outcomes = []
            with progress(console, f"attacks on {backend}", len(attacks) + len(benign)) as advance:
                for attack in attacks:
                    outcomes.append(anyio.run(run_attack, backend, attack, where))
                    advance(1)
                benign_results = []
                for snippet in benign:
                    benign_results.append(anyio.run(run_benign, backend, snippet))
                    advance(1)
            result["backends"][backend] = {
                "isolation": isolation,
                "attacks": outcomes,
                "benign": benign_results,
            }
    return result


def summary_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per attack class, one column per backend (contained/total), plus benign and control."""
    backends = list(result["backends"])
    classes: list[str] = []
    for data in result["backends"].values():
        for outcome in data["attacks"]:
            if outcome["class"] not in classes:
                classes.append(outcome["class"])
    control = result.get("control", {})
    effective = control.get("attacks_effective", {})
    rows = []
    for name in classes:
        row = [name]
        for backend in backends:
            group = [o for o in result["backends"][backend]["attacks"] if o["class"] == name]
            row.append(f"{sum(o['contained'] for o in group)}/{len(group)}")
        checked = {k: v for k, v in effective.items() if k.startswith(name + "/")}
        row.append(f"{sum(checked.values())}/{len(checked)}" if checked else "n/a")
        rows.append(row)
    total = ["all attacks"]
    for backend in backends:
        group = result["backends"][backend]["attacks"]
        total.append(f"{sum(o['contained'] for o in group)}/{len(group)}")
    total.append(f"{sum(effective.values())}/{len(effective)}" if effective else "n/a")
    rows.append(total)
    benign_row = ["benign correct"]
    for backend in backends:
        group = result["backends"][backend]["benign"]
        benign_row.append(f"{sum(b['correct'] for b in group)}/{len(group)}")
    ok = control.get("benign_correct", {})
    benign_row.append(f"{sum(ok.values())}/{len(ok)}" if ok else "n/a")
    rows.append(benign_row)
    columns = [
        "class",
        *(f"{b} ({result['backends'][b]['isolation']})" for b in backends),
        "control: works unsandboxed",
    ]
    return columns, rows


def report(console: Console, result: dict[str, Any]) -> None:
    columns, rows = summary_rows(result)
    notes = [
        "attack cells: contained/total; control: attacks whose effect happens without a sandbox "
        "(write, read, env and network attacks)"
    ]
    for backend, reason in result["unavailable"].items():
        notes.append(f"{backend}: unavailable: {reason[:160]}")
    print_table(console, "Security corpus", columns, rows, note="\n".join(notes))
    for backend, data in result["backends"].items():
        for outcome in data["attacks"]:
            if not outcome["contained"]:
                console.print(
                    f"  NOT CONTAINED on {backend}: {outcome['class']}/{outcome['name']}",
                    markup=False,
                    highlight=False,
                )
        for snippet in data["benign"]:
            if not snippet["correct"]:
                console.print(
                    f"  benign wrong on {backend}: {snippet['name']}: {snippet['error'] or snippet['stdout']!r}",
                    markup=False,
                    highlight=False,
                )
    effective = result.get("control", {}).get("attacks_effective", {})
    for key, worked in effective.items():
        if not worked:
            console.print(
                f"  control: {key} had no effect even without a sandbox", markup=False, highlight=False
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        action="append",
        choices=[*BACKEND_CHOICES, "all"],
        help="backend to attack (repeatable; default all: every one that works here)",
    )
    parser.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="CLASS",
        help="only this attack class (repeatable): "
        + ", ".join(sorted(p.stem for p in CORPUS.glob("*.toml") if p.stem != "benign")),
    )
    parser.add_argument("--no-control", action="store_true", help="skip the unsandboxed control run")
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/security-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    """Exit 0 when every attack was contained and every benign snippet was right on every backend run."""
    console = make_console(args.json)
    chosen = args.backend or ["all"]
    backends = list(BACKEND_CHOICES) if "all" in chosen else list(dict.fromkeys(chosen))
    result = run(backends=backends, classes=args.classes, control=not args.no_control, console=console)
    publish("security", result, args, console, report)
    if not result["backends"]:
        return 3
    clean = all(o["contained"] for d in result["backends"].values() for o in d["attacks"]) and all(
        b["correct"] for d in result["backends"].values() for b in d["benign"]
    )
    return 0 if clean else 1


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.security", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
