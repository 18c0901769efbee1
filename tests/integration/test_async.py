"""warren.AsyncClient (grpc.aio) against a real warrend: 500 concurrent
sandboxes from one event loop, and the async streaming / process / session
surface (issue 3)."""

from __future__ import annotations

import asyncio
import threading
import time

import warren

N_CONCURRENT = 500


def test_500_concurrent_sandboxes_from_one_event_loop(daemon, base_layer) -> None:
    threads_before = threading.active_count()

    async def main() -> tuple:
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as ac:
            peak = 0
            live = 0

            async def one(i: int) -> bytes:
                nonlocal peak, live
                # Admission refuses creates beyond --max-creates-in-flight
                # (retryable): retried with backoff.
                sb = await ac.create(layers=[base_layer], labels={"async": "500"}, retries=1000, timeout=300)
                live += 1
                peak = max(peak, live)
                try:
                    r = await sb.exec(f"echo {i}", timeout=120)
                    assert r.exit_code == 0
                    # All of them exist at the same time before any is destroyed.
                    if live >= N_CONCURRENT:
                        all_created.set()
                    await all_created.wait()
                    return r.stdout
                finally:
                    live -= 1
                    await sb.destroy(timeout=120)

            all_created = asyncio.Event()
            t0 = time.monotonic()
            outs = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(N_CONCURRENT))), timeout=600)
            dt = time.monotonic() - t0
            threads_during = threading.active_count()
            left = await ac.list(labels={"async": "500"})
            return outs, dt, peak, threads_during, left

    outs, dt, peak, threads_during, left = asyncio.run(main())
    assert outs == [f"{i}\n".encode() for i in range(N_CONCURRENT)]
    assert peak == N_CONCURRENT  # really 500 at once
    assert left == []
    # One channel, no thread per call (grpc.aio keeps a few threads of its own).
    assert threads_during - threads_before < 20, (threads_before, threads_during)
    print(f"500 concurrent create+exec+destroy: {dt:.1f} s")


def test_async_streaming_processes_and_sessions(daemon, base_layer) -> None:
    async def main() -> None:
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as ac:
            async with await ac.create(layers=[base_layer]) as sb:
                # streaming exec: first chunk before the end
                t0 = time.monotonic()
                seen = []
                async with sb.exec_stream("echo a; sleep 1.5; echo b >&2; exit 3") as st:
                    async for c in st:
                        seen.append((time.monotonic() - t0, c.stream, c.data))
                assert [(s, d) for _, s, d in seen] == [("stdout", b"a\n"), ("stderr", b"b\n")]
                assert seen[0][0] < 1.0 and st.result.exit_code == 3
                # stdin streamed
                st = sb.exec_stream("read -r x; echo got:$x")
                await st.send_stdin(b"hi\n")
                assert (await st.wait()).exit_code == 0
                got = []
                r = await sb.exec("echo x; echo y >&2", on_stdout=got.append, timeout=30)
                assert r.stdout == b"x\n" and r.stderr == b"y\n" and got == [b"x\n"]
                # background process
                p = await sb.spawn("echo out; cat; exit 5")
                await p.send_stdin("in\n")
                await p.close_stdin()
                assert (await p.wait(timeout=30)).exit_code == 5
                assert (await p.output()).stdout == b"out\nin\n"
                assert [i.id for i in await sb.processes()] == [p.id]
                assert (await (await sb.process(p.id)).info()).exit_code == 5
                # session
                sh = await sb.session()
                async with sh:
                    await sh.run("cd /tmp; v=7", timeout=30)
                    r = await sh.run("echo $v $PWD; printf x", timeout=30)
                    assert r.stdout == b"7 /tmp\nx"
                    r = await sh.run("sleep 50", timeout=1)
                    assert r.timed_out and r.exit_code == 130
                    assert (await sh.run("echo ok", timeout=30)).stdout == b"ok\n"

    asyncio.run(main())


def test_async_suspend_resume_and_jobs(daemon, base_layer) -> None:
    """The async side has every method of the sync one: suspend (raised
    AttributeError), resume(prefetch=...), jobs(), create(retries=...)."""
    async def main() -> None:
        async with warren.AsyncClient("unix:" + str(daemon.socket)) as ac:
            job = f"async-suspend-{time.monotonic_ns()}"
            async with await ac.create(layers=[base_layer], job=job, retries=3) as sb:
                await sb.files.write("/tmp/kept", b"kept\n")
                p = await sb.spawn("sleep 1000")
                info = await sb.suspend()
                assert info.state == "suspended"
                assert (await sb.info()).state == "suspended"
                assert (await sb.resume(prefetch=False)).state == "running"
                assert await sb.files.read("/tmp/kept") == b"kept\n"
                assert (await p.info()).running
                await sb.suspend()
                assert (await sb.resume()).state == "running"
                assert job in [j.name for j in await ac.jobs()]
                assert [s.id for s in await ac.job(job).list()] == [sb.id]

    asyncio.run(main())
