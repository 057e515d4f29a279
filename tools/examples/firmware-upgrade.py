#!/usr/bin/env python3
"""Upgrade an accessory's firmware through iapd with the Python client, or with nothing but iapctl.

The accessory speaks the firmware-update protocol of AccessoryHost's simulator (its
`firmware-update` behaviour; the framing is documented in
Sources/AccessorySimulator/FirmwareUpdate.swift): BEGIN, READY, CHUNK/ACK, END, DONE, then it
reboots with the new version. The steps:

  1. `iapctl wait --protocol P` finds the accessory and its current firmware;
  2. `iapctl open P --socket PATH` opens the session and offers it on a Unix socket; this script
     connects and sends the image, several chunks in flight, printing progress, and checks the
     accessory's verdict (status and the CRC-32 it computed);
  3. `iapctl wait --firmware VERSION` waits for the accessory to come back with the new version.

Through iapd, with the Python client installed (`pip install tools/clients/python`, the package
`accessoryhost`), the script does the same without a subprocess: `client.wait_for`, then
`client.open` maps the session's rings in this process, then `client.wait_for(firmware=…)`.
`--via library` (the default when the package imports, iapd's socket exists and no --serial is
given) or `--via iapctl` (the steps above) chooses.

Nothing is resumed or retried silently: when a transfer breaks, the script says how many bytes
the accessory acknowledged and exits non-zero.

Exit status, as iapctl's (sysexits.h): 0 upgraded (or already at that version), 64 usage
error, 65 the accessory refused the image or computed another CRC, 66 the image cannot be read,
69 no accessory speaks the protocol (or iapctl cannot be run), 70 (--fleet) an unexpected error in
one accessory's upgrade, 74 the transfer broke (the
message says how many bytes the accessory acknowledged), 75 the accessory did not appear, answer
or come back in time; any other status of an iapctl it ran, passed on.

iapctl is looked for on PATH (tools/install.sh puts it there), or given with --iapctl or the
IAPCTL environment variable.

With --fleet, every accessory that speaks the protocol is upgraded at the same time, each through
its own `iapctl open` (through iapd, which shares the accessories): a live table on a terminal,
one JSON line per accessory on standard output as it finishes (result upgraded, failed with its
error, or current), then a summary line. One that fails does so alone; the exit status is then that
of the failure that came first. Accessories are told apart by serial number.

Examples:
  firmware-upgrade.py --serial /dev/pts/5 image.bin 2.0.0   # a serial accessory (or iapctl simulate's pty)
  firmware-upgrade.py image.bin 2.0.0                       # a USB accessory
  firmware-upgrade.py --fleet --count 8 image.bin 2.0.0     # eight at once, through iapd
"""
import argparse
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time

from firmware_protocol import (EX_IOERR, EX_NOINPUT, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE,
                               Failure, transfer)

try:
    import accessoryhost  # the Python client (tools/clients/python); optional: --via iapctl needs none
except ImportError:
    accessoryhost = None

def log(text):
    print(f"firmware-upgrade: {text}", file=sys.stderr, flush=True)


def run_iapctl(command, timeout):
    """Runs iapctl, returns its standard output; raises Failure with its message otherwise."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise Failure(f"cannot run {command[0]}: not found on PATH; install it (tools/install.sh) "
                      "or give its path with --iapctl or IAPCTL", EX_UNAVAILABLE)
    except subprocess.TimeoutExpired:
        raise Failure(f"{' '.join(command)} did not finish within {timeout:.0f} s", EX_TEMPFAIL)
    if result.returncode != 0:
        raise Failure(f"{' '.join(command[1:])} exited with {result.returncode}: {result.stderr.strip()}", result.returncode)
    return result.stdout


def print_progress(acknowledged, total, rate, done):
    """The single upgrade's progress on standard error: a line redrawn on a terminal, a line
    every 2 s otherwise."""
    line = f"{acknowledged * 100 // total:3d}%  {acknowledged} of {total} bytes  {rate / 1e6:.2f} MB/s"
    interactive = sys.stderr.isatty()
    print(("\r" if interactive else "") + "firmware-upgrade: " + line, end="" if interactive and not done else "\n",
          file=sys.stderr, flush=True)


def upgrade(args, base, before, image, progress=print_progress, interval=None, say=log):
    """Upgrades the accessory whose record (iapctl's JSON) is before: opens the session with
    `iapctl open … --socket`, sends the image, waits for the accessory to come back with the
    new version. Returns (its record afterwards, transfer seconds); raises Failure."""
    serial = before["serialNumber"]
    timeout = ["--timeout", str(args.timeout)]
    with tempfile.TemporaryDirectory(prefix="firmware-upgrade-") as directory:
        path = os.path.join(directory, "session.sock")
        # iapctl's messages go to a file: a pipe nobody reads during the transfer could fill.
        errors = open(os.path.join(directory, "open.err"), "w+")
        opener = subprocess.Popen(base + ["open", args.protocol, "--accessory", serial, "--socket", path] + timeout,
                                  stdout=subprocess.PIPE, stderr=errors, text=True)

        def opener_errors():
            errors.seek(0)
            return errors.read().strip()

        try:
            # "listening on PATH" once the session is open (bounded: iapctl may hang on a
            # silent accessory).
            if not select.select([opener.stdout], [], [], args.timeout + 30)[0]:
                raise Failure(f"iapctl open did not open the session within {args.timeout + 30:.0f} s", EX_TEMPFAIL)
            line = opener.stdout.readline()
            if not line.startswith("listening on "):
                opener.wait(timeout=30)
                raise Failure(f"iapctl open exited with {opener.returncode}: {opener_errors()}", opener.returncode or EX_IOERR)
            say(f"session {args.protocol} open; sending {len(image)} bytes as version {args.version}")
            try:
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                connection.settimeout(args.timeout)  # an accessory that stops answering fails the upgrade, it does not hang it
                connection.connect(path)
                crc, seconds = transfer(connection, image, args.version, args.window, progress, interval)
            except Failure as failure:
                # The session's end is iapctl's to explain (the accessory went away, and how).
                if opener.poll() is None:
                    try:
                        opener.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                reason = opener_errors()
                if reason:
                    raise Failure(f"{failure} (iapctl open: {reason.splitlines()[-1]})", failure.status)
                raise
            say(f"the accessory verified the image (CRC-32 0x{crc:08x}) after {seconds:.2f} s, "
                f"{len(image) / max(seconds, 1e-9) / 1e6:.2f} MB/s; it reboots now")
            # The accessory reboots right after DONE: iapctl open may see it go (exit 74).
            try:
                status = opener.wait(timeout=args.timeout)
            except subprocess.TimeoutExpired:
                raise Failure(f"iapctl open did not end within {args.timeout:.0f} s after the transfer", EX_TEMPFAIL)
            if status not in (0, 74):
                raise Failure(f"iapctl open exited with {status}: {opener_errors()}", status)
        finally:
            if opener.poll() is None:
                opener.kill()
                opener.wait()
            errors.close()
    after = json.loads(run_iapctl(base + ["wait", "--json", "--serial-number", serial, "--firmware", args.version] + timeout
                                  + ["--protocol", args.protocol], args.timeout + 30).splitlines()[0])["accessory"]
    say(f"{after['name']} (serial {serial}) is back with firmware {after['firmwareRevision']} "
        f"(was {before['firmwareRevision']})")
    return after, seconds


class IapctlWay:
    """The accessories through iapctl processes (`iapctl list`, `wait`, `open --socket`)."""

    def __init__(self, args, base):
        self.args, self.base = args, base

    def find(self):
        match = ["--protocol", self.args.protocol] + (["--serial-number", self.args.serial_number] if self.args.serial_number else [])
        # iapctl's JSON (docs/JSON.md): the accessory is under "accessory" on every line.
        return json.loads(run_iapctl(self.base + ["wait", "--json", "--timeout", str(self.args.timeout)] + match,
                                     self.args.timeout + 30).splitlines()[0])["accessory"]

    def discover(self):
        return discover(self.args, self.base)

    def upgrade(self, before, image, progress=print_progress, interval=None, say=log):
        return upgrade(self.args, self.base, before, image, progress, interval, say)

    def close(self):
        pass


def record_of(accessory):
    """The Python client's Accessory as the fields of iapctl's JSON this script reads."""
    return {"serialNumber": accessory.serial_number, "name": accessory.name, "firmwareRevision": accessory.firmware_revision,
            "location": accessory.location, "protocolStrings": list(accessory.protocol_strings)}


class SessionStream:
    """A session of the Python client with the socket methods transfer() uses: reads wait at
    most the timeout (then socket.timeout, as a socket's), an ended session reads b""."""

    def __init__(self, client, session, timeout):
        self.client, self.session, self.timeout = client, session, timeout

    def sendall(self, data):
        try:
            self.session.write(data, timeout=self.timeout)
        except accessoryhost.Timeout as error:
            raise Failure(f"the accessory took nothing for {self.timeout:.0f} s: {error}", EX_TEMPFAIL)
        except accessoryhost.SessionClosed as error:
            raise Failure(str(error))

    def recv(self, size):
        try:
            data = self.session.read(size, timeout=self.timeout)
        except accessoryhost.Timeout:
            raise socket.timeout() from None
        except accessoryhost.SessionClosed:
            return b""
        if not data:
            reason = self.client.disconnect_reason(self.session.accessory.id, timeout=2.0)
            why = f"the accessory disconnected: {reason}" if reason else "the accessory closed it or went away"
            raise Failure(f"the session ended ({why}) after {self.session.bytes_acknowledged} bytes acknowledged")
        return data

    def close(self):
        self.session.close()


class LibraryWay:
    """The accessories through iapd with the Python client: no subprocess, the session's
    rings mapped in this process. One connection serves every accessory of a fleet."""

    def __init__(self, args):
        self.args = args
        try:
            self.client = accessoryhost.connect(name="firmware-upgrade.py")
        except accessoryhost.IapdError as error:
            raise Failure(str(error), EX_UNAVAILABLE)

    def find(self):
        try:
            accessory = self.client.wait_for(protocol=self.args.protocol, serial=self.args.serial_number, timeout=self.args.timeout)
        except accessoryhost.Timeout as error:
            raise Failure(str(error), EX_TEMPFAIL)
        return record_of(accessory)

    def discover(self):
        """As discover(): those there now (at least one), or with --count N once N are."""
        deadline = time.monotonic() + self.args.timeout
        wanted = self.args.count or 1
        while True:
            records = [record_of(accessory) for accessory in self.client.accessories()
                       if accessory.speaks(self.args.protocol)
                       and (not self.args.serial_number or accessory.serial_number == self.args.serial_number)]
            if len(records) >= wanted:
                return records
            left = deadline - time.monotonic()
            if left <= 0:
                raise Failure(f"{len(records)} accessories speak {self.args.protocol} after {self.args.timeout:.0f} s; "
                              f"{wanted} wanted (plugged in? iapctl list shows what is there)", EX_TEMPFAIL)
            try:
                self.client.next_event(timeout=min(left, 1.0))  # an accessory came or went: look again
            except accessoryhost.Timeout:
                pass

    def upgrade(self, before, image, progress=print_progress, interval=None, say=log):
        """Opens the session, sends the image, waits for the accessory to come back with the new
        version. Returns (its record afterwards, transfer seconds); raises Failure."""
        args, serial = self.args, before["serialNumber"]
        try:
            accessory = self.client.wait_for(protocol=args.protocol, serial=serial, timeout=args.timeout)
            session = self.client.open(accessory, args.protocol, timeout=args.timeout)
        except accessoryhost.Timeout as error:
            raise Failure(str(error), EX_TEMPFAIL)
        except accessoryhost.IapdError as error:
            raise Failure(str(error), EX_UNAVAILABLE)
        say(f"session {args.protocol} open; sending {len(image)} bytes as version {args.version}")
        stream = SessionStream(self.client, session, args.timeout)
        try:
            crc, seconds = transfer(stream, image, args.version, args.window, progress, interval)
        except accessoryhost.IapdError as error:
            raise Failure(str(error))
        finally:
            session.close()
        say(f"the accessory verified the image (CRC-32 0x{crc:08x}) after {seconds:.2f} s, "
            f"{len(image) / max(seconds, 1e-9) / 1e6:.2f} MB/s; it reboots now")
        try:
            after = self.client.wait_for(protocol=args.protocol, serial=serial, firmware=args.version, timeout=args.timeout)
        except accessoryhost.Timeout as error:
            raise Failure(str(error), EX_TEMPFAIL)
        say(f"{after.name} (serial {serial}) is back with firmware {after.firmware_revision} (was {before['firmwareRevision']})")
        return record_of(after), seconds

    def close(self):
        self.client.close()


def choose_way(args, base):
    """--via: the Python client through iapd, or iapctl processes."""
    via = args.via
    if via is None:
        socket_path = os.environ.get("IAPD_SOCKET") or "/run/iapd/iapd.sock"
        via = "library" if accessoryhost is not None and not args.serial and os.path.exists(socket_path) else "iapctl"
    if via == "library":
        if accessoryhost is None:
            raise Failure("--via library needs the Python client: pip install tools/clients/python (the package accessoryhost)", EX_UNAVAILABLE)
        if args.serial:
            raise Failure("--via library goes through iapd; give iapd the port (iapd --serial) instead of --serial", EX_USAGE)
        return LibraryWay(args)
    return IapctlWay(args, base)


# ---- the fleet: every accessory that speaks the protocol, at once ----------------------------

class Row:
    """One accessory of the fleet: what the table shows and its JSON line says."""

    def __init__(self, record):
        self.record = record
        self.serial = record["serialNumber"]
        self.state = "waiting"
        self.acknowledged = self.total = 0
        self.rate = 0.0
        self.error = None
        self.status = None
        self.after = None
        self.seconds = None
        self.transfer_started = None


def discover(args, base):
    """The accessories that speak the protocol: those there now (at least one), or with
    --count N, once N are; iapctl list is asked every half second until --timeout."""
    deadline = time.monotonic() + args.timeout
    wanted = args.count or 1
    while True:
        try:
            records = [json.loads(line)["accessory"]
                       for line in run_iapctl(base + ["list", "--json", "--timeout", "5"], 60).splitlines() if line.strip()]
        except Failure as failure:
            # One list that fails (a device that could not be opened yet) is asked again.
            if time.monotonic() > deadline:
                raise
            log(f"iapctl list failed; asking again: {failure}")
            records = []
        records = [record for record in records if args.protocol in record.get("protocolStrings", [])
                   and (not args.serial_number or record["serialNumber"] == args.serial_number)]
        if len(records) >= wanted:
            return records
        if time.monotonic() > deadline:
            raise Failure(f"{len(records)} accessories speak {args.protocol} after {args.timeout:.0f} s; "
                          f"{wanted} wanted (plugged in? iapctl list shows what is there)", EX_TEMPFAIL)
        time.sleep(0.5)


def fleet_line(row):
    """The accessory's JSON line (standard output, once it is done)."""
    line = {"serialNumber": row.serial, "name": row.record["name"], "location": row.record["location"],
            "firmwareBefore": row.record["firmwareRevision"], "result": row.state, "exitStatus": row.status}
    if row.after is not None:
        line["firmwareAfter"] = row.after
    if row.seconds is not None:
        line.update(bytes=row.total, seconds=round(row.seconds, 3), megabytesPerSecond=round(row.total / max(row.seconds, 1e-9) / 1e6, 3))
    if row.error is not None:
        line["error"] = row.error
    return json.dumps(line)


def draw(rows, first):
    """The live table on standard error (a terminal): redrawn in place."""
    lines = [f"{'serial':<16} {'firmware':<10} {'state':<10} {'progress':>24} {'MB/s':>7}"]
    for row in rows:
        progress = ""
        if row.total:
            progress = f"{row.acknowledged * 100 // row.total:3d}% {row.acknowledged / 1048576:.1f}/{row.total / 1048576:.1f} MiB"
        detail = row.error if row.state == "failed" else ""
        lines.append(f"{row.serial[:16]:<16} {row.record['firmwareRevision'][:10]:<10} {row.state:<10} {progress:>24} "
                     f"{row.rate / 1e6:7.2f}  {detail}")
    up = "" if first else f"\x1b[{len(lines)}A"
    sys.stderr.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
    sys.stderr.flush()


def run_fleet(args, way, image):
    """--fleet: upgrades every accessory that speaks the protocol at once, each in a thread of
    its own (with the Python client, one connection to iapd; otherwise one `iapctl open` each).
    Exit status 0 when every one was upgraded (or ran the version already), otherwise that of
    the failure that came first."""
    import threading
    try:
        rows = [Row(record) for record in way.discover()]
    except Failure as error:
        log(f"FAILED: {error}")
        return error.status
    serials = [row.serial for row in rows]
    duplicated = sorted({serial for serial in serials if serials.count(serial) > 1})
    if duplicated:
        log(f"FAILED: several accessories report the serial number {', '.join(duplicated)}; the fleet tells "
            "accessories apart by serial number (upgrade them one at a time with --serial-number and --serial)")
        return EX_USAGE
    changed = threading.Condition()
    output = threading.Lock()
    failures = []  # in the order they happened
    interactive = sys.stderr.isatty()

    def note(row, state=None, text=None):
        with changed:
            if state is not None:
                row.state = state
            changed.notify()
        if text is not None and not interactive:
            log(f"{row.serial}: {text}")

    def work(row):
        def progress(acknowledged, total, rate, done):
            row.acknowledged, row.total, row.rate = acknowledged, total, rate
            note(row, "verifying" if done else "sending",
                 f"{acknowledged * 100 // total:3d}%  {acknowledged} of {total} bytes  {rate / 1e6:.2f} MB/s")

        def say(text):
            if text.startswith("session "):
                row.transfer_started = time.monotonic()
                note(row, "sending", text)
            elif text.startswith("the accessory verified"):
                note(row, "rebooting", text)
            else:
                note(row, None, text)

        try:
            note(row, "opening")
            after, row.seconds = way.upgrade(row.record, image, progress, 2.0 if not interactive else 0.2, say)
            row.after, row.status = after["firmwareRevision"], 0
            note(row, "upgraded")
        except Exception as error:  # every failure is this accessory's alone, and reported
            if isinstance(error, Failure):
                status = error.status
            elif isinstance(error, OSError):
                status = EX_IOERR
            else:
                status, error = EX_SOFTWARE, f"{type(error).__name__}: {error}"
            # An iapctl killed by a signal has a negative status: keep it an exit status.
            row.error, row.status = str(error), status if 0 < status < 256 else EX_SOFTWARE
            with output:
                failures.append(row)
            note(row, "failed", f"FAILED: {error}")
        finally:
            with output:
                print(fleet_line(row), flush=True)

    workers = []
    for row in rows:
        if row.record["firmwareRevision"] == args.version and not args.force:
            row.state, row.status = "current", 0
            with output:
                print(fleet_line(row), flush=True)
            continue
        worker = threading.Thread(target=work, args=(row,), name=row.serial, daemon=True)
        workers.append(worker)
    log(f"upgrading {len(workers)} of {len(rows)} accessories speaking {args.protocol} to {args.version} at once")
    begun = time.monotonic()
    for worker in workers:
        worker.start()
    first = True
    with changed:
        while any(worker.is_alive() for worker in workers):
            if interactive:
                draw(rows, first)
                first = False
            changed.wait(0.2 if interactive else 1.0)
    if interactive:
        draw(rows, first)
    for worker in workers:
        worker.join()
    upgraded = [row for row in rows if row.state == "upgraded"]
    failed = [row for row in rows if row.state == "failed"]
    moved = sum(row.total for row in upgraded)
    summary = {"accessories": len(rows), "upgraded": len(upgraded), "failed": len(failed),
               "current": len(rows) - len(workers), "bytes": moved, "seconds": round(time.monotonic() - begun, 3)}
    if upgraded:
        # Aggregate: the bytes of every upgraded accessory over the time from the first transfer's
        # start to the last one's end (the reboots after are left out, as in each accessory's rate).
        start = min(row.transfer_started for row in upgraded)
        end = max(row.transfer_started + row.seconds for row in upgraded)
        times = os.times()
        script, children = times.user + times.system, times.children_user + times.children_system
        summary.update(transferSeconds=round(end - start, 3), megabytesPerSecond=round(moved / max(end - start, 1e-9) / 1e6, 3),
                       clientCPUMillisecondsPerMiB=round((script + children) * 1000 / (moved / 1048576), 2),
                       scriptCPUMillisecondsPerMiB=round(script * 1000 / (moved / 1048576), 2))
        summary["via"] = "library" if isinstance(way, LibraryWay) else "iapctl"
        log(f"{len(upgraded)} upgraded, {len(failed)} failed: {moved} bytes in {end - start:.2f} s, "
            f"{summary['megabytesPerSecond']:.2f} MB/s in all; this script and its iapctl processes (if any) used "
            f"{summary['clientCPUMillisecondsPerMiB']:.1f} ms of CPU per MiB")
    for row in failed:
        log(f"FAILED: {row.serial}: {row.error}")
    with output:
        print(json.dumps({"summary": summary}), flush=True)
    return failures[0].status if failures else 0


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("image", help="the firmware image file")
    parser.add_argument("version", help="the version the accessory must report afterwards")
    parser.add_argument("--iapctl", default=os.environ.get("IAPCTL", "iapctl"), help="the iapctl binary (default: $IAPCTL or iapctl)")
    parser.add_argument("--serial", metavar="DEVICE[:BAUD]", help="the accessory is on this serial port (default: USB)")
    parser.add_argument("--protocol", default="com.example.firmware", help="the firmware-update protocol string")
    parser.add_argument("--serial-number", help="which accessory, when several speak the protocol")
    parser.add_argument("--window", type=int, default=8, help="CHUNKs in flight (default 8)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds for each wait (default 60)")
    parser.add_argument("--force", action="store_true", help="upgrade even when the accessory already reports the version")
    parser.add_argument("--fleet", action="store_true",
                        help="upgrade every accessory that speaks the protocol at once (through iapd): a live table "
                             "on a terminal, one JSON line per accessory on standard output")
    parser.add_argument("--via", choices=("library", "iapctl"),
                        help="the Python client through iapd, or iapctl processes (default: library when the package "
                             "accessoryhost imports, iapd's socket exists and --serial is not given)")
    parser.add_argument("--count", type=int, default=0, metavar="N",
                        help="with --fleet: wait until N accessories speak the protocol (default: those there once one is)")
    return parser.parse_args()


def main():
    try:
        args = parse_arguments()
    except SystemExit as exit:
        return EX_USAGE if exit.code else 0  # argparse exits 2 on a usage error, 0 after --help
    if args.window < 1 or args.count < 0 or (args.count and not args.fleet):
        log("usage error: --window must be at least 1, and --count (with --fleet only) at least 1")
        return EX_USAGE
    try:
        with open(args.image, "rb") as file:
            image = file.read()
    except OSError as error:
        log(f"cannot read the image: {error}")
        return EX_NOINPUT
    if not image:
        log(f"the image {args.image} is empty")
        return EX_NOINPUT

    base = [args.iapctl] + (["--no-usb", "--serial", args.serial] if args.serial else [])
    try:
        way = choose_way(args, base)
    except Failure as error:
        log(f"FAILED: {error}")
        return error.status
    try:
        if args.fleet:
            return run_fleet(args, way, image)
        before = way.find()
        log(f"found {before['name']} (serial {before['serialNumber']}) with firmware {before['firmwareRevision']} "
            f"on {before['location']}")
        if before["firmwareRevision"] == args.version and not args.force:
            log(f"it already runs {args.version}; nothing to do (--force upgrades anyway)")
            return 0
        way.upgrade(before, image)
        return 0
    except Failure as error:
        log(f"FAILED: {error}")
        return error.status
    except OSError as error:
        log(f"FAILED: {error}")
        return EX_IOERR
    finally:
        way.close()


if __name__ == "__main__":
    sys.exit(main())
