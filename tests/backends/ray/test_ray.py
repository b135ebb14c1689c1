"""The ray backend's own behaviour, on the real local cluster of `backend_ray` (what it shares with every
backend is in the conformance and security suites): placement across nodes and capacity, the tool bridge
across the cluster, faults (a node killed mid-run, an agent killed mid-run, no cluster), the node's
Docker backend, and a second driver joining the running cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import Any

import anyio
import pytest
from support import backend_ray
from support.needs import require

from sandboxes import HostExecutor, Policy, WorkerStartError

pytestmark = [pytest.mark.anyio, pytest.mark.ray]

SLEEPER = Policy(allowed_imports=["time"])


@pytest.fixture(scope="module")
def cluster() -> Any:
    require(backend_ray.unavailable(), "the ray backend")
    return backend_ray.cluster()


def executor(**options: Any) -> Any:
    return backend_ray.make_executor(**options)


def alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


async def test_sessions_spread_over_the_nodes_up_to_their_capacity(cluster: Any) -> None:
    from sandboxes.backends.ray import capacity

    total = capacity()
    assert total == 2 * backend_ray.PER_NODE  # the head node declares none
    async with anyio.create_task_group() as group:
        sessions = [executor(timeout=10) for _ in range(total)]
        for session in sessions:
            group.start_soon(session.open)
    try:
        placed = [s.node_id for s in sessions]
        assert len(set(placed)) == 2, placed  # more sessions than one node takes: both nodes serve
        assert all(placed.count(node) == backend_ray.PER_NODE for node in set(placed))
        for session in sessions:
            assert (await session.run("print(1)")).stdout == "1\n"
        # The cluster is full: a further session waits for capacity, and says so when it runs out of time.
        with pytest.raises(WorkerStartError, match="capacity"):
            await executor(timeout=10, placement_timeout=1).open()
        waiting = executor(timeout=10, placement_timeout=30)
        async with anyio.create_task_group() as group:
            group.start_soon(waiting.open)
            await anyio.sleep(0.5)
            assert waiting.node_id is None  # still queued in Ray's scheduler
            await sessions[0].close()
        assert waiting.node_id == placed[0]  # it took the freed place
        assert (await waiting.run("print(2)")).stdout == "2\n"
        await waiting.close()
    finally:
        for session in sessions:
            await session.close()


async def test_tools_run_in_the_parent_process_across_the_cluster(cluster: Any) -> None:
    seen: list[int] = []

    def where() -> int:
        seen.append(os.getpid())
        return os.getpid()

    async def twice(n: int) -> int:
        await anyio.sleep(0)
        return 2 * n

    def refuse(reason: str) -> None:
        raise PermissionError(reason)

    tools = {"where": where, "twice": twice, "refuse": refuse}
    code = (
        "print(where(), twice(21))\n"
        "try:\n    refuse('no access')\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
        "print(twice(n=4))"
    )
    async with executor(timeout=10, tools=tools) as ex:
        result = await ex.run(code)
    async with HostExecutor(timeout=10, tools=tools) as local:
        expected = await local.run(code)
    assert result.ok, result
    assert result.stdout.startswith(f"{os.getpid()} 42\n") and "PermissionError: no access" in result.stdout
    assert result.stdout == expected.stdout  # the same observation as on the node's backend run locally
    assert seen == [os.getpid(), os.getpid()]


async def test_a_node_killed_mid_run_loses_that_run_and_the_next_lands_on_a_live_node(cluster: Any) -> None:
    import ray

    started = threading.Event()
    calls: list[int] = []

    def begin() -> None:
        calls.append(1)
        started.set()

    async with executor(policy=SLEEPER, timeout=60, tools={"begin": begin}) as ex:
        assert (await ex.run("x = 1")).ok
        doomed = ex.node_id
        node = next(n for n in cluster.worker_nodes if n.node_id == doomed)

        def kill_when_started() -> None:
            assert started.wait(30)
            backend_ray.kill_node(cluster, node)

        killer = threading.Thread(target=kill_when_started)
        killer.start()
        try:
            crashed = await ex.run("begin()\nimport time\ntime.sleep(40)\nprint('survived')")
        finally:
            killer.join()
        try:
            assert crashed.state_lost and crashed.error is not None, crashed
            assert crashed.error.type == "WorkerCrashed" and "node" in crashed.error.message
            assert "survived" not in crashed.stdout
            after = await ex.run("print('back')")
            gone = await ex.run("print(x)")
            assert after.ok and after.stdout == "back\n" and not after.state_lost, after
            assert ex.node_id != doomed and ex.node_id in alive_nodes()
            assert gone.error is not None and gone.error.type == "NameError"
            assert calls == [1]  # the lost snippet was never run again
        finally:
            backend_ray.replace_node(cluster)
    assert doomed not in {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


async def test_an_agent_killed_mid_run_never_runs_the_snippet_twice(cluster: Any) -> None:
    import ray

    from sandboxes.backends.ray.cluster import agent

    started = threading.Event()
    calls: list[int] = []

    def begin() -> None:
        calls.append(1)
        started.set()

    async with executor(policy=SLEEPER, timeout=60, tools={"begin": begin}) as ex:
        await ex.run("x = 1")
        node = ex.node_id
        handle = agent(node)

        def kill_when_started() -> None:
            assert started.wait(30)
            ray.kill(handle, no_restart=False)  # as a crash: Ray would restart it if allowed to

        killer = threading.Thread(target=kill_when_started)
        killer.start()
        try:
            crashed = await ex.run("begin()\nimport time\ntime.sleep(40)\nprint('survived')")
        finally:
            killer.join()
        assert crashed.state_lost and crashed.error is not None and crashed.error.type == "WorkerCrashed", (
            crashed
        )
        after = await ex.run("print('back')")
        assert after.ok and after.stdout == "back\n", after
        await anyio.sleep(1)
    assert calls == [1]  # neither a restart nor a retry ran it again


async def test_a_cancelled_run_replaces_the_session(cluster: Any) -> None:
    async with executor(policy=SLEEPER, timeout=60) as ex:
        await ex.run("x = 1")
        with anyio.move_on_after(1):
            await ex.run("import time\ntime.sleep(30)")
        after = await ex.run("print('fresh')")
        gone = await ex.run("print(x)")
    assert after.ok and after.stdout == "fresh\n" and after.state_lost
    assert gone.error is not None and gone.error.type == "NameError"


@pytest.mark.docker
async def test_docker_on_the_node(cluster: Any) -> None:
    from support import backend_docker

    backend_docker.require()
    from sandboxes.backends.ray import RayExecutor

    async with RayExecutor(node_backend="docker", image=backend_docker.IMAGE, timeout=20) as ex:
        result = await ex.run("import math\nprint(math.factorial(10))")
        assert ex.isolation == "container"
    assert result.ok and result.stdout == "3628800\n", result


def _driver(script: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `script` as another driver process (a fresh interpreter, not connected to Ray yet)."""
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | (env or {})
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=environment
    )


def test_no_cluster_at_the_address_is_backend_unavailable_with_the_fix() -> None:
    script = (
        "import anyio\nfrom sandboxes import open_executor, BackendUnavailable\n"
        "async def main():\n    async with open_executor('ray', address='127.0.0.1:9'):\n        pass\n"
        "try:\n    anyio.run(main)\nexcept BackendUnavailable as exc:\n    print('unavailable:', exc)\n"
    )
    done = _driver(script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("unavailable: no Ray cluster answers at '127.0.0.1:9'"), done.stdout
    assert "ray start --head" in done.stdout


def test_another_driver_joins_the_running_cluster(cluster: Any) -> None:
    """With address=None a driver joins the running cluster (here found through RAY_ADDRESS, as
    `ray.init(address="auto")` does) and its sessions land on that cluster's nodes."""
    script = (
        "import anyio\nfrom sandboxes import open_executor\n"
        "async def main():\n    async with open_executor('ray', timeout=10) as ex:\n"
        "        r = await ex.run('print(6 * 7)')\n        print(ex.node_id, r.stdout.strip(), ex.isolation)\n"
        "anyio.run(main)\n"
    )
    done = _driver(script, {"RAY_ADDRESS": cluster.address})
    assert done.returncode == 0, done.stderr[-2000:]
    node_id, answer, isolation = done.stdout.split()
    assert node_id in alive_nodes() and answer == "42" and isolation in ("namespaces", "process")


def test_sandboxes_imports_without_ray() -> None:
    script = (
        "import sys\nsys.modules['ray'] = None\nimport sandboxes\n"
        "from sandboxes import open_executor, BackendUnavailable\n"
        "import anyio\nasync def main():\n    async with open_executor('ray'):\n        pass\n"
        "try:\n    anyio.run(main)\nexcept BackendUnavailable as exc:\n    print(exc)\n"
    )
    done = _driver(script)
    assert done.returncode == 0, done.stderr
    assert "pip install 'kodeagent[ray]'" in done.stdout


def test_doctor_reports_the_cluster(cluster: Any) -> None:
    import json

    done = subprocess.run(
        [sys.executable, "-m", "kodeagent_cli", "doctor", "--backend", "ray", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"RAY_ADDRESS": cluster.address},
    )
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    ray_check = checks["backend ray"]
    assert ray_check["ok"], ray_check
    assert (
        "runs code (isolation: namespaces" in ray_check["detail"]
        or "isolation: process" in ray_check["detail"]
    )
    assert f"capacity {2 * backend_ray.PER_NODE} (kodeagent_sandbox)" in ray_check["detail"], ray_check
    sizes = re.search(r"3 nodes taking ([\d, ]+) sandboxes", ray_check["detail"])
    assert sizes and sorted(int(n) for n in sizes.group(1).split(", ")) == [
        0,
        backend_ray.PER_NODE,
        backend_ray.PER_NODE,
    ], ray_check


def test_humaneval_spreads_over_the_cluster_at_its_capacity(cluster: Any) -> None:
    from benchmarks.common import make_console
    from benchmarks.humaneval import run

    result = run(
        backend="ray",
        limit=8,
        baseline=False,
        backend_options={"node_backend": "host"},
        console=make_console(json_mode=True),
    )
    assert (
        result["concurrency"] == 2 * backend_ray.PER_NODE
    )  # the cluster's capacity, not this machine's CPUs
    assert result["sandbox"]["passed"] == result["sandbox"]["total"] == 8, result["failures"]


async def test_a_session_whose_driver_died_is_closed_by_its_node(cluster: Any) -> None:
    """A driver killed without closing its session: Ray removes the driver's placement groups with its
    job, and the node's agent closes the session whose group is gone (its worker does not live on)."""
    import signal

    from sandboxes.backends.ray.cluster import agent

    script = (
        "import anyio, sys, time\nfrom sandboxes import open_executor\n"
        "async def main():\n    ex = await open_executor('ray', timeout=10).open()\n"
        "    await ex.run('x = 1')\n    print(ex.node_id, flush=True)\n    time.sleep(600)\n"
        "anyio.run(main)\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "RAY_ADDRESS": cluster.address
    }
    driver = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=environment
    )
    try:
        with anyio.fail_after(120):
            node_id = (await anyio.to_thread.run_sync(driver.stdout.readline)).strip()  # type: ignore[union-attr]
        handle = agent(node_id)
        assert (await handle.info.remote())["sessions"] >= 1
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    with anyio.fail_after(60):
        while (await handle.info.remote())["sessions"] > 0:
            await anyio.sleep(0.5)


async def test_a_codeact_agent_runs_its_code_on_the_cluster(cluster: Any) -> None:
    """CodeActAgent(run_env="ray") against the LLM stand-in: the code runs on a node, the tool here."""
    from support.llm_standin import StandinLLM, code_final, code_step, collect, register_standin_models

    from kodeagent import CodeActAgent, tool

    callers: list[int] = []

    @tool
    def get_price(symbol: str) -> float:
        """Latest price of a stock. Args: symbol: ticker, e.g. AAPL."""
        callers.append(os.getpid())
        return {"AAPL": 200.0, "MSFT": 410.5}[symbol]

    register_standin_models()
    with StandinLLM() as llm:
        llm.add(
            code_step("prices = [get_price('AAPL'), get_price(symbol='MSFT')]\nprint(sum(prices) / 2)"),
            code_step("print(len(prices))"),
            code_final("305.25"),
        )
        agent = CodeActAgent(
            llm.model("json"),
            litellm_params=llm.params(),
            tools=[get_price],
            run_env="ray",
            timeout=20,
            executor_options={"node_backend": "host"},
        )
        agent.retry_base_delay = 0.01
        responses = await collect(agent.run("Average of AAPL and MSFT?"))
        observations = [r["messages"][-1]["content"] for r in llm.requests[1:]]
    assert responses[-1].type == "final" and responses[-1].value == "305.25"
    assert observations == [
        "Observation:\nOutput:\n305.25",
        "Observation:\nOutput:\n2",
    ]  # state kept on the node
    assert callers == [os.getpid()] * 2


async def test_a_node_lost_while_idle_fails_the_next_run_once_then_a_live_node_serves(cluster: Any) -> None:
    async with executor(timeout=30) as ex:
        assert (await ex.run("x = 1")).ok
        doomed = ex.node_id
        node = next(n for n in cluster.worker_nodes if n.node_id == doomed)
        await anyio.to_thread.run_sync(backend_ray.kill_node, cluster, node)
        try:
            with anyio.fail_after(60):
                lost = await ex.run("print(x)")
            assert lost.state_lost and lost.error is not None and lost.error.type == "WorkerCrashed", lost
            after = await ex.run("print('back')")
            assert after.ok and after.stdout == "back\n", after
            assert ex.node_id != doomed and ex.node_id in alive_nodes()
        finally:
            await anyio.to_thread.run_sync(backend_ray.replace_node, cluster)


def test_the_blocking_facade(cluster: Any) -> None:
    from sandboxes import open_executor_sync

    with open_executor_sync("ray", node_backend="host", timeout=10, tools={"f": lambda v: v * 2}) as ex:
        first = ex.run("x = f(21)\nprint(x)")
        second = ex.run("print(x + 1)")
        assert ex.isolation in ("namespaces", "process")
    assert first.stdout == "42\n" and second.stdout == "43\n"


async def test_a_fork_lands_on_its_parents_node_and_holds_a_unit_there(cluster: Any) -> None:
    """The fork contract itself runs on ray in `tests/conformance/test_fork.py`; here, where the family
    lives: every fork on its parent's node, each holding a unit there until its own close."""
    from sandboxes.backends.ray.cluster import agent

    parent = await executor(timeout=10).open()
    try:
        assert (await parent.run("x = 1")).ok
        node_id = parent.node_id
        assert node_id is not None
        node = agent(node_id)
        before = (await node.info.remote())["sessions"]
        child = await parent.fork()
        assert child.node_id == node_id and child.isolation == parent.isolation
        assert (await node.info.remote())["sessions"] == before + 1
    finally:
        await parent.close()
    async with child:
        assert (await node.info.remote())["sessions"] == before  # the parent's session went, the child's not
        async with await child.fork() as grandchild:
            assert grandchild.node_id == node_id
            assert (await node.info.remote())["sessions"] == before + 1
            assert (await grandchild.run("print(x * 10)")).stdout == "10\n"
    assert (await node.info.remote())["sessions"] == before - 1


async def test_a_fork_on_a_full_node_waits_for_a_unit_there_or_is_refused(cluster: Any) -> None:
    """Both nodes take `PER_NODE` sessions. A fork's unit is pinned to its parent's node: on a full
    node the fork is refused after its wait although the other node has room, the parent intact; a fork
    that waits is not given a unit freed on the other node, and takes the one its own node gives up."""
    from sandboxes import ForkError

    fill = backend_ray.PER_NODE - 1  # forks that fill a node beside their parent
    sessions: list[Any] = []
    try:
        impatient = await executor(timeout=10, placement_timeout=1).open()
        sessions.append(impatient)
        assert (await impatient.run("x = 1")).ok
        for _ in range(fill):  # its node is full then; the other has room for PER_NODE
            sessions.append(await impatient.fork())
            assert sessions[-1].node_id == impatient.node_id
        first = sessions[-1]
        with pytest.raises(ForkError, match="capacity on its parent's node"):
            await impatient.fork()
        intact = await impatient.run("print(x)")
        assert intact.ok and intact.stdout == "1\n" and not intact.state_lost, intact

        patient = await executor(timeout=10, placement_timeout=20).open()
        sessions.append(patient)
        assert patient.node_id != impatient.node_id  # the only node with room
        assert (await patient.run("x = 2")).ok
        for _ in range(fill):  # both nodes are full then
            sessions.append(await patient.fork())
        second = sessions[-1]
        waited: list[Any] = []

        async def fork_when_free() -> None:
            waited.append(await patient.fork())

        async with anyio.create_task_group() as group:
            group.start_soon(fork_when_free)
            await first.close()  # a unit on the other node: not the fork's
            await anyio.sleep(1)
            assert not waited  # still waiting for a unit on its parent's node
            await second.close()
        sessions.extend(waited)
        assert waited[0].node_id == patient.node_id
        assert (await waited[0].run("print(x + 1)")).stdout == "3\n"
    finally:
        for ex in sessions:
            await ex.close()


async def test_a_fork_the_nodes_backend_refuses_leaves_the_parent_on_its_node(
    cluster: Any, tmp_path: Any
) -> None:
    """The node's executor refuses (a session with a sandbox of its own cannot be forked there): the
    driver raises its `ForkError`, the parent runs on, and no session was added on the node."""
    from sandboxes import ForkError
    from sandboxes.backends.ray.cluster import agent

    async with executor(timeout=10, isolation="namespaces", workdir=str(tmp_path)) as parent:
        assert (await parent.run("x = 1")).ok
        node = agent(parent.node_id)
        before = (await node.info.remote())["sessions"]
        with pytest.raises(ForkError, match="sandbox of its own"):
            await parent.fork()
        after = await parent.run("print(x)")
        assert after.ok and after.stdout == "1\n" and not after.state_lost, after
        assert (await node.info.remote())["sessions"] == before


async def test_a_snapshot_holds_a_unit_of_its_node_and_closes_with_its_executor(cluster: Any) -> None:
    """A snapshot is a kept fork: a session on its parent's node, holding a unit there. The parent, its
    snapshot and sessions opened from it fill a node of `PER_NODE`: one more opening waits for a unit
    on that node and is refused past the wait, the snapshot and the parent intact."""
    from sandboxes import ExecutorClosed, ForkError, open_executor
    from sandboxes.backends.ray.cluster import agent

    parent = await executor(timeout=10, placement_timeout=1).open()
    opened: list[Any] = []
    try:
        assert (await parent.run("x = 1")).ok
        node = agent(parent.node_id)
        before = (await node.info.remote())["sessions"]
        snapshot = await parent.snapshot()
        assert (await node.info.remote())["sessions"] == before + 1  # the kept copy is a session there
        assert (await parent.run("x = 2")).ok
        for _ in range(backend_ray.PER_NODE - 2):
            opened.append(await open_executor("ray", from_snapshot=snapshot).open())
            assert opened[-1].node_id == parent.node_id
        with pytest.raises(ForkError, match="capacity on its parent's node"):
            await open_executor("ray", from_snapshot=snapshot).open()
        assert not snapshot.closed and (await parent.run("print(x)")).stdout == "2\n"
    finally:
        for ex in opened:
            await ex.close()
        await parent.close()
    assert snapshot.closed
    with pytest.raises(ExecutorClosed):
        snapshot.executor()
    assert (await node.info.remote())["sessions"] == before - 1


async def test_node_agents_size_their_host_pools_by_their_node(cluster: Any) -> None:
    """Each node's agent sizes its host pools by the node as the cluster declares it (one CPU, and
    `PER_NODE` sandbox units: no more idle workers than it can hold sessions), to the sessions
    starting on it at once, and back down without that demand; `pools()` reports it."""
    import ray

    from sandboxes.backends.host.demand import BASE_POOL
    from sandboxes.backends.ray.cluster import agent

    async def pools(node: str) -> dict[str, Any]:
        sizes: dict[str, Any] = await anyio.to_thread.run_sync(ray.get, agent(node).pools.remote())
        return sizes

    options = {"timeout": 20, "env": {"POOLS": "node"}}
    sessions = [executor(**options) for _ in range(2 * backend_ray.PER_NODE)]
    try:
        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(session.open)
        nodes = {s.node_id for s in sessions}
        assert len(nodes) == 2
        for node in nodes:  # every session of the node is still starting (none has run yet)
            sizes = await pools(node)
            assert (sizes["cores"], sizes["max_pool"], sizes["max_spawners"]) == (1, backend_ray.PER_NODE, 1)
            assert sizes["in_flight"] == sizes["peak"] == backend_ray.PER_NODE, sizes
            assert sizes["pool_size"] == backend_ray.PER_NODE and sizes["spawners"] == 1, sizes
        for session in sessions:
            assert (await session.run("print(5)")).stdout == "5\n"
    finally:
        for session in sessions:
            await session.close()
    with anyio.fail_after(120):  # without that demand the node's pools size back down (~5 s)
        for node in nodes:
            while True:
                sizes = await pools(node)
                assert sizes["ready_largest"] <= backend_ray.PER_NODE and sizes["in_flight"] == 0, sizes
                if sizes["pool_size"] == BASE_POOL and sizes["ready_largest"] <= BASE_POOL:
                    break
                await anyio.sleep(0.5)
