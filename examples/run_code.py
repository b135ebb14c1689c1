"""Run untrusted code in a sandbox session: state kept between runs, a refused import, a timeout.

python examples/run_code.py [--backend host|docker|e2b|ray]
"""

import argparse

from sandboxes import Policy, open_executor_sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="host")
    backend = parser.parse_args().backend
    policy = Policy(allowed_imports=["math", "json"])
    with open_executor_sync(backend, policy=policy, timeout=2) as ex:
        r = ex.run("import math\nradius = 2\nprint(round(math.pi * radius**2, 3))")
        print("area:", r.stdout.strip())
        print("kept between runs:", ex.run("radius * 10").value)
        r = ex.run("import subprocess")
        print("refused:", r.error.type if r.error else None)
        r = ex.run("while True: pass")
        print("timed out:", r.timed_out)
        print("the session goes on:", ex.run("1 + 1").value)


if __name__ == "__main__":
    main()
