"""Code written for E2B, unmodified, against `kodeagent serve` on this machine.

kodeagent serve --http 127.0.0.1:49982 &          # prints its API key
export E2B_API_URL=http://127.0.0.1:49982 E2B_SANDBOX_URL=http://127.0.0.1:49982 E2B_API_KEY=e2b_...
python examples/e2b_client.py                     # pip install 'e2b<3' 'e2b-code-interpreter<3'
"""

from e2b_code_interpreter import Sandbox


def main() -> None:
    with Sandbox.create(timeout=300) as sandbox:
        print("sandbox:", sandbox.sandbox_id)
        execution = sandbox.run_code("import math\nmath.factorial(10)")
        print("run_code:", execution.text)
        sandbox.files.write("/home/user/data.csv", "a,b\n1,2\n")
        # Code and commands run in the home: a path relative to it reaches the file on every backend.
        print("command:", sandbox.commands.run("wc -l data.csv").stdout.strip())
        again = Sandbox.connect(sandbox.sandbox_id)  # any process can reach a live sandbox
        print("connected:", again.run_code("open('data.csv').read().split()[1]").text)


if __name__ == "__main__":
    main()
