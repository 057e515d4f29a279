"""The asyncio form and selectors against a real iapd."""

from __future__ import annotations

import asyncio
import selectors

import pytest

import accessoryhost
import accessoryhost.aio
from accessoryhost import Connected

from conftest import ECHO, Daemon
from test_client import LONG, pattern


def test_asyncio_lists_waits_and_echoes_4_mib(daemon: Daemon) -> None:
    data = pattern(4 << 20, seed=3)

    async def main() -> bytes:
        async with await accessoryhost.aio.connect(daemon.socket) as client:
            accessory = await client.wait_for(protocol=ECHO, timeout=LONG)
            assert [record.id for record in await client.accessories()] == [accessory.id]
            assert (await client.stats())["sessionsNow"] == 0
            async with await client.open(accessory, ECHO) as session:
                writer = asyncio.ensure_future(session.write(data, timeout=LONG))
                received = await session.read_exactly(len(data), timeout=LONG)
                assert await writer == len(data)
                await session.drain(timeout=LONG)
                assert session.bytes_acknowledged == len(data)
                with pytest.raises(accessoryhost.UnsupportedProtocol):
                    await client.open(accessory, "com.example.none")
                try:
                    extra = await session.read(1, timeout=0.2)
                    raise AssertionError(f"read {extra!r} after the echo (ended {session.ended})")
                except accessoryhost.Timeout:
                    pass
            with pytest.raises(accessoryhost.SessionClosed):
                await session.write(b"x")
            # Only this accessory's connection (when it came after the hello) can be waiting;
            # then nothing more comes.
            with pytest.raises(accessoryhost.Timeout):
                for _ in range(2):
                    event = await client.next_event(timeout=0.2)
                    assert isinstance(event, Connected) and event.accessory.id == accessory.id
            return received
    assert asyncio.run(main()) == data


def test_asyncio_sees_events_and_a_daemon_going_away(daemon: Daemon) -> None:
    async def main() -> None:
        client = await accessoryhost.aio.connect(daemon.socket)
        accessory = await client.wait_for(protocol=ECHO, timeout=LONG)
        session = await client.open(accessory, ECHO)
        await asyncio.get_running_loop().run_in_executor(None, daemon.stop)
        assert await session.read(16, timeout=LONG) == b""
        # The events iapd sent before it went (the accessory's connection, when it came after
        # the hello; its disconnection as iapd stopped) come first, then the end.
        with pytest.raises(accessoryhost.DaemonGone):
            for _ in range(100):
                assert isinstance(await client.next_event(timeout=LONG), (Connected, accessoryhost.Disconnected))
        with pytest.raises(accessoryhost.DaemonGone):
            await client.ping()
        session.close()
        client.close()
        await asyncio.get_running_loop().run_in_executor(None, daemon.start)
        async with await accessoryhost.aio.connect(daemon.socket) as again:
            assert (await again.wait_for(protocol=ECHO, timeout=LONG)).serial_number == accessory.serial_number
    asyncio.run(main())


def test_asyncio_many_sessions_at_once(daemon: Daemon) -> None:
    async def main() -> None:
        async with await accessoryhost.aio.connect(daemon.socket) as client:
            accessory = await client.wait_for(protocol=ECHO, timeout=LONG)
            sessions = [await client.open(accessory, name) for name in ("com.example.echo", "com.example.telemetry")]

            async def echo(session: accessoryhost.aio.AsyncSession, seed: int) -> bool:
                data = pattern(1 << 20, seed)
                writer = asyncio.ensure_future(session.write(data, timeout=LONG))
                ok = await session.read_exactly(len(data), timeout=LONG) == data
                await writer
                session.close()
                return ok
            assert await asyncio.gather(*(echo(session, seed) for seed, session in enumerate(sessions))) == [True, True]
    asyncio.run(main())


def test_selectors_drive_a_session_without_threads(daemon: Daemon) -> None:
    data = pattern(8 << 20, seed=4)
    with accessoryhost.connect(daemon.socket) as client:
        accessory = client.wait_for(protocol=ECHO, timeout=LONG)
        with client.open(accessory, ECHO) as session, selectors.DefaultSelector() as selector:
            selector.register(session, selectors.EVENT_READ)
            sent, received = 0, bytearray()
            while len(received) < len(data):
                progress = False
                if sent < len(data):
                    count = session.write_nowait(memoryview(data)[sent:sent + (1 << 20)])
                    sent += count
                    progress = count > 0
                chunk = session.read_nowait(1 << 20)
                if chunk:
                    received += chunk
                    progress = True
                if not progress:
                    assert selector.select(LONG), "no wake-up from iapd"
            assert received == data


def test_the_iterator_of_events_ends_with_its_timeout(daemon: Daemon) -> None:
    with accessoryhost.connect(daemon.socket) as client:
        events = list(client.events(timeout=0.3))
        assert all(isinstance(event, Connected) for event in events)
