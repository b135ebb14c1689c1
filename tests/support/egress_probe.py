"""Looks for a secret everywhere a session can: run `probe_code(needles)` in a session with
``python_guards=False`` and read its JSON line.

The search runs in a child process that alone knows the needles (the snippet carries them XORed,
so the runner's memory never holds them because of the probe): its environment and every visible
process's ``/proc/PID/environ`` and ``cmdline``, the memory of every other visible process (the
runner's, through ``/proc/PID/mem``: the snippet makes the runner dumpable for it), and every file of
every writable mount, ``/etc``, ``/tmp``, the working directory and ``HOME``
(a read-only mount is this machine's or the image's own files, made before the session).
"""

from __future__ import annotations

import json

SCAN = r"""
import json, os, sys
needles = [bytes(b ^ 0x5A for b in bytes.fromhex(h)) for h in sys.argv[1:]]
found = {"environ": [], "proc": [], "memory": [], "files": []}
def hit(data):
    return any(n in data for n in needles)
if hit("\0".join(f"{k}={v}" for k, v in os.environ.items()).encode()):
    found["environ"].append("own")
me = os.getpid()
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
memory_scanned = []
for pid in pids:
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as f:
                if hit(f.read()):
                    found["proc"].append(f"{pid}/{part}")
        except OSError:
            pass
    if pid == me:
        continue
    try:
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        mem = open(f"/proc/{pid}/mem", "rb", buffering=0)
    except OSError:
        continue
    scanned = 0
    with mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5] in ("[vvar]", "[vsyscall]")):
                continue
            low, high = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(low)
                data = mem.read(high - low)
            except (OSError, OverflowError, ValueError):
                continue
            scanned += len(data or b"")
            if data and hit(data):
                found["memory"].append(f"{pid}:{fields[-1] if len(fields) > 5 else 'anon'}")
    if scanned:
        memory_scanned.append(pid)
writable, readonly = [], set()
for line in open("/proc/self/mountinfo").read().splitlines():
    fields = line.split()
    point, options = fields[4], fields[5].split(",")
    if point.startswith(("/proc", "/sys", "/dev")):
        continue
    if "rw" in options:
        writable.append(point)
    else:
        readonly.add(point)
roots = sorted(set(writable) | {"/etc", "/tmp", os.getcwd(), os.path.expanduser("~")})  # a parent may be unlistable
files = 0
seen = set()
for root in roots:
    for folder, dirs, names in os.walk(root):
        if folder.startswith(("/proc", "/sys", "/dev")):
            dirs[:] = []
            continue
        dirs[:] = [d for d in dirs if os.path.join(folder, d) not in readonly]
        for name in names:
            path = os.path.join(folder, name)
            if path in seen or not os.path.isfile(path) or os.path.islink(path):
                continue
            seen.add(path)
            try:
                with open(path, "rb") as f:
                    data = f.read(64 * 1024 * 1024)
            except OSError:
                continue
            files += 1
            if hit(data):
                found["files"].append(path)
print(json.dumps({**found, "runner": os.getppid(), "memory_scanned": memory_scanned, "files_scanned": files, "roots": roots}))
"""


def probe_code(needles: list[str | bytes]) -> str:
    """The snippet: prints one JSON line (where each needle was found, and how much was searched)."""
    raw = [needle.encode() if isinstance(needle, str) else needle for needle in needles]
    hidden = [bytes(b ^ 0x5A for b in needle).hex() for needle in raw]
    return (
        "import ctypes, json, subprocess, sys\n"
        "ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the probe may read this process\n"
        f"_probe = subprocess.run([sys.executable, '-I', '-c', {SCAN!r}, *{hidden!r}], "
        "capture_output=True, text=True, timeout=120)\n"
        "print(_probe.stdout.strip().splitlines()[-1] if _probe.stdout.strip() else json.dumps({'error': _probe.stderr[-2000:]}))\n"
    )


def key_needles(key: object) -> list[str | bytes]:
    """What a leaked EC private key would look like: its PEM's first body lines and its raw scalar."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert isinstance(key, ec.EllipticCurvePrivateKey)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    scalar = key.private_numbers().private_value.to_bytes(32, "big")
    return [pem.splitlines()[2], scalar]


def parse(stdout: str) -> dict[str, object]:
    return json.loads(stdout.strip().splitlines()[-1])
