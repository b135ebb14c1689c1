"""`files.watch_dir` through the unmodified `e2b` SDK, both forms: the sync SDK's CreateWatcher /
GetWatcherEvents / RemoveWatcher and the async SDK's streaming WatchDir. Events come from the kernel on
the home as this machine sees it; a watch never reaches outside the home (not by path, not through a
symlink planted in it), a watcher id means nothing to another sandbox, and watchers and their queues
are bounded."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support.served import Served

e2b = pytest.importorskip("e2b")
from e2b import AsyncSandbox, Sandbox  # noqa: E402
from e2b.exceptions import InvalidArgumentException, NotFoundException, SandboxException  # noqa: E402
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType  # noqa: E402
from e2b.sandbox_sync.filesystem.watch_handle import WatchHandle  # noqa: E402

from sandboxes.adapters.serve.envd.watch import MAX_QUEUED, MAX_WATCHERS  # noqa: E402

pytestmark = pytest.mark.e2b


@pytest.fixture
def sandbox(served: Served) -> Iterator[Sandbox]:
    made = Sandbox.create(**served.sdk_options())
    yield made
    made.kill()


def run(served: Served, sandbox: Sandbox, code: str, tenant: str = "alice") -> Any:
    executor = served.app.registry.get(tenant, sandbox.sandbox_id).sandbox.executor
    result = served.call(lambda: executor.run(code))
    assert result.error is None, result.error
    return result.value


def events_until(handle: WatchHandle, wanted: set[tuple[str, FilesystemEventType]]) -> list[Any]:
    seen: list[Any] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen += handle.get_new_events()
        if wanted <= {(e.name, e.type) for e in seen}:
            break
        time.sleep(0.05)
    return seen


# ------------------------------------------------------------------ attacks


@pytest.mark.parametrize("path", ["/etc", "/home/user/../..", "/proc/self", "../"])
def test_a_path_outside_the_home_is_refused(sandbox: Sandbox, path: str) -> None:
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir(path)


def test_a_symlink_in_the_home_does_not_lead_a_watch_outside(
    served: Served, sandbox: Sandbox, tmp_path: pathlib.Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    run(
        served,
        sandbox,
        f"import os\nos.makedirs('d')\nos.symlink({str(outside)!r}, 'out')\nos.symlink({str(outside)!r}, 'd/out')",
    )
    with pytest.raises(InvalidArgumentException, match="symlink"):
        sandbox.files.watch_dir("/home/user/out")
    handle = sandbox.files.watch_dir("/home/user/d", recursive=True)
    (outside / "secret.txt").write_text("made outside the home")
    (outside / "sub").mkdir()
    run(served, sandbox, "open('d/inside.txt', 'w').write('x')")
    seen = events_until(handle, {("inside.txt", FilesystemEventType.CREATE)})
    assert {e.name for e in seen} == {"inside.txt"}  # nothing of the outside directory
    handle.stop()


def test_another_sandboxs_watcher_id_gets_nothing(served: Served, sandbox: Sandbox) -> None:
    other = Sandbox.create(**served.sdk_options("bob"))
    try:
        mine = sandbox.files.watch_dir("/home/user")
        sandbox.files.write("/home/user/private.txt", "alice's")
        files = other.files
        stolen = WatchHandle(files._rpc, mine._watcher_id, files._connection_config, files._envd_version)
        with pytest.raises(NotFoundException):
            stolen.get_new_events()
        with pytest.raises(NotFoundException):
            stolen.stop()
        seen = events_until(mine, {("private.txt", FilesystemEventType.CREATE)})
        assert ("private.txt", FilesystemEventType.CREATE) in {(e.name, e.type) for e in seen}  # not taken
        mine.stop()
    finally:
        other.kill()


def test_a_streaming_watch_cannot_be_read_or_stopped_by_id(served: Served, sandbox: Sandbox) -> None:
    async def main() -> list[Any]:
        asb = await AsyncSandbox.connect(sandbox.sandbox_id, **served.sdk_options())
        got: list[Any] = []
        handle = await asb.files.watch_dir("/home/user", on_event=got.append)
        (key,) = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.watchers
        files = sandbox.files
        guessed = WatchHandle(files._rpc, key, files._connection_config, files._envd_version)
        with pytest.raises(NotFoundException):
            guessed.get_new_events()
        with pytest.raises(NotFoundException):
            guessed.stop()
        await asb.files.write("/home/user/still.txt", "streamed")
        for _ in range(200):
            if any(e.name == "still.txt" for e in got):
                break
            await asyncio.sleep(0.05)
        await handle.stop()
        return got

    assert "still.txt" in {e.name for e in asyncio.run(main())}  # the stream kept its events


def test_watchers_per_sandbox_are_capped(served: Served, sandbox: Sandbox) -> None:
    handles = [sandbox.files.watch_dir("/home/user") for _ in range(MAX_WATCHERS)]
    with pytest.raises(SandboxException, match=f"at most {MAX_WATCHERS} watchers"):
        sandbox.files.watch_dir("/home/user")
    handles.pop().stop()
    handles.append(sandbox.files.watch_dir("/home/user"))  # a stopped one's place is free again
    for handle in handles:
        handle.stop()
    assert served.app.registry.get("alice", sandbox.sandbox_id).sandbox.watchers == {}


def test_a_flood_of_events_is_bounded_and_keeps_the_latest(served: Served, sandbox: Sandbox) -> None:
    handle = sandbox.files.watch_dir("/home/user")
    run(served, sandbox, "for i in range(3000): open(f'f{i}', 'w').close()")
    events = handle.get_new_events()
    assert len(events) <= MAX_QUEUED
    assert events[-1].name == "f2999"  # the oldest went first
    handle.stop()


# ------------------------------------------------------------------ what the SDK sees


def test_sync_watch_reports_create_write_rename_remove_recursively(served: Served, sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/d/old.txt", "1")
    handle = sandbox.files.watch_dir("/home/user/d", recursive=True)
    sandbox.commands.run(
        "cd d && echo more >> old.txt && mkdir sub && echo a > sub/new && mv old.txt moved.txt"
    )
    sandbox.files.remove("/home/user/d/moved.txt")
    wanted = {
        ("old.txt", FilesystemEventType.WRITE),
        ("sub", FilesystemEventType.CREATE),
        ("sub/new", FilesystemEventType.CREATE),
        ("old.txt", FilesystemEventType.RENAME),
        ("moved.txt", FilesystemEventType.CREATE),
        ("moved.txt", FilesystemEventType.REMOVE),
    }
    seen = events_until(handle, wanted)
    assert wanted <= {(e.name, e.type) for e in seen}
    handle.stop()
    with pytest.raises(SandboxException):
        handle.get_new_events()  # the SDK's own check: stopped


def test_async_watch_streams_events_and_frees_its_place(served: Served, sandbox: Sandbox) -> None:
    async def main() -> list[Any]:
        asb = await AsyncSandbox.connect(sandbox.sandbox_id, **served.sdk_options())
        got: list[Any] = []
        handle = await asb.files.watch_dir("/home/user", on_event=got.append)
        assert len(served.app.registry.get("alice", sandbox.sandbox_id).sandbox.watchers) == 1
        await asb.files.write("/home/user/streamed.txt", "hello")
        for _ in range(200):
            if any(e.name == "streamed.txt" for e in got):
                break
            await asyncio.sleep(0.05)
        await handle.stop()
        return got

    got = asyncio.run(main())
    assert ("streamed.txt", FilesystemEventType.CREATE) in {(e.name, e.type) for e in got}
    deadline = time.monotonic() + 10
    held = served.app.registry.get("alice", sandbox.sandbox_id).sandbox
    while held.watchers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert held.watchers == {}  # the stream's watcher went with the stream


def test_killing_a_sandbox_closes_its_watchers(served: Served) -> None:
    sandbox = Sandbox.create(**served.sdk_options())
    sandbox.files.watch_dir("/home/user")
    (watcher,) = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.watchers.values()
    sandbox.kill()
    assert watcher.closed
