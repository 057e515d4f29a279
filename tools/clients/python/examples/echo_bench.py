#!/usr/bin/env python3
"""A 16 MiB echo from Python through iapd against `iapctl send --verify-echo` through the same
iapd, in turns (issue 36's goal: Python at least 0.8x iapctl).

Starts iapd (--bin DIR, default the repository's .build/release) on a socket of its own serving
its built-in simulated accessory, then runs ROUNDS pairs: iapctl's transfer (its own "seconds",
the open excluded) and this library's (a writer thread and the reader here, the echo compared
byte for byte at the end, then drain: every byte acknowledged by the accessory). Prints each
pair, the median of each and the median of the ratios; one JSON line with --json. Exit status
0, or 1 when a transfer failed (the goal is reported, not enforced: machines are noisy).

Usage: echo_bench.py [--bin DIR] [--mib N] [--rounds N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, List

import accessoryhost

PROTOCOL = "com.example.echo"


def cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def python_echo(client: accessoryhost.Client, accessory: accessoryhost.Accessory, data: bytes) -> "tuple[float, float]":
    """Seconds from the first byte written to the last echoed, compared and acknowledged, and
    this process's CPU seconds meanwhile (both threads)."""
    with client.open(accessory, PROTOCOL) as session:
        received = bytearray(len(data))
        view = memoryview(received)
        failure: List[BaseException] = []

        def write() -> None:
            try:
                session.write(data, timeout=60)
            except BaseException as error:
                failure.append(error)
        start, used = time.monotonic(), cpu(resource.RUSAGE_SELF)
        writer = threading.Thread(target=write)
        writer.start()
        done = 0
        while done < len(data):
            count = session.readinto(view[done:], timeout=60)
            if count == 0:
                raise SystemExit(f"the session ended after {done} bytes")
            done += count
        writer.join()
        if failure:
            raise failure[0]
        session.drain(timeout=60)
        if received != data:
            raise SystemExit("the echo differs from what was sent")
        seconds, used = time.monotonic() - start, cpu(resource.RUSAGE_SELF) - used
        view.release()
        return seconds, used


def iapctl_echo(iapctl: Path, socket_path: str, file: str) -> "tuple[float, float]":
    """iapctl's own transfer seconds, and its CPU seconds (the whole process: start and open too)."""
    used = cpu(resource.RUSAGE_CHILDREN)
    result = subprocess.run([str(iapctl), "send", "--json", "--verify-echo", PROTOCOL, file], capture_output=True, text=True,
                            timeout=300, env=dict(os.environ, IAPD_SOCKET=socket_path))
    if result.returncode != 0:
        raise SystemExit(f"iapctl send exited with {result.returncode}: {result.stderr.strip()}")
    report = json.loads(result.stdout.splitlines()[-1])
    if not report.get("verified"):
        raise SystemExit(f"iapctl send did not verify the echo: {report}")
    return float(report["seconds"]), cpu(resource.RUSAGE_CHILDREN) - used


def copy(source: "IO[bytes]", target: "IO[bytes]") -> None:
    """Copies the rest of a child's output (a thread of its own)."""
    for line in source:
        target.write(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    repository = Path(__file__).resolve().parents[4]
    parser.add_argument("--bin", default=str(repository / ".build" / "release"))
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    binaries = Path(options.bin)
    data = os.urandom(options.mib << 20)
    with tempfile.TemporaryDirectory(prefix="echo-bench-") as work:
        file = os.path.join(work, "data.bin")
        with open(file, "wb") as out:
            out.write(data)
        socket_path = os.path.join(work, "iapd.sock")
        daemon = subprocess.Popen([str(binaries / "iapd"), "--socket", socket_path, "--no-usb", "--simulate"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # iapd logs "listening on PATH" once its socket accepts; the rest of its log goes to a
            # file (a thread copies it, so a full pipe never holds iapd up).
            assert daemon.stderr is not None
            log = open(os.path.join(work, "iapd.log"), "wb")
            for line in daemon.stderr:
                log.write(line)
                if b"listening on " in line:
                    break
            else:
                raise SystemExit("iapd exited before it listened")
            threading.Thread(target=copy, args=(daemon.stderr, log), daemon=True).start()
            client = accessoryhost.connect(socket_path, name="echo_bench")
            with client:
                accessory = client.wait_for(protocol=PROTOCOL, timeout=60)
                python_echo(client, accessory, data[:1 << 20])  # warm-up
                pairs = []
                cpus = []
                for index in range(options.rounds):
                    theirs, their_cpu = iapctl_echo(binaries / "iapctl", socket_path, file)
                    ours, our_cpu = python_echo(client, accessory, data)
                    pairs.append((theirs, ours))
                    cpus.append((their_cpu, our_cpu))
                    if not options.json:
                        print(f"round {index + 1}: iapctl {len(data) / theirs / 1e6:7.1f} MB/s   "
                              f"python {len(data) / ours / 1e6:7.1f} MB/s   ratio {theirs / ours:.2f}   "
                              f"CPU per MiB: iapctl {their_cpu * 1000 / options.mib:.1f} ms (whole process), "
                              f"python {our_cpu * 1000 / options.mib:.1f} ms", flush=True)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    iapctl_rate = statistics.median(len(data) / theirs / 1e6 for theirs, _ in pairs)
    python_rate = statistics.median(len(data) / ours / 1e6 for _, ours in pairs)
    ratio = statistics.median(theirs / ours for theirs, ours in pairs)
    iapctl_cpu = statistics.median(theirs for theirs, _ in cpus) * 1000 / options.mib
    python_cpu = statistics.median(ours for _, ours in cpus) * 1000 / options.mib
    summary = {"mib": options.mib, "rounds": options.rounds, "iapctlMegabytesPerSecond": round(iapctl_rate, 2),
               "pythonMegabytesPerSecond": round(python_rate, 2), "ratio": round(ratio, 3), "goal": 0.8, "met": ratio >= 0.8,
               "iapctlCPUMillisecondsPerMiB": round(iapctl_cpu, 2), "pythonCPUMillisecondsPerMiB": round(python_cpu, 2)}
    if options.json:
        print(json.dumps(summary))
    else:
        print(f"median of {options.rounds} rounds, {options.mib} MiB echoed through iapd: iapctl send --verify-echo "
              f"{iapctl_rate:.1f} MB/s, python {python_rate:.1f} MB/s; python/iapctl {ratio:.2f} "
              f"(goal 0.8: {'met' if ratio >= 0.8 else 'MISSED'}); CPU per MiB: iapctl {iapctl_cpu:.1f} ms (whole process), "
              f"python {python_cpu:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
