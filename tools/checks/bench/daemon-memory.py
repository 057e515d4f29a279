#!/usr/bin/env python3
"""iapd's resident memory with many sessions open (issue 33's memory goal).

Starts iapd (the release build by default) serving one simulated accessory that declares N echo
protocols, opens a session on each through the daemon's protocol 3 (the reply's descriptors:
the session's socket and its rings' memfd), and reads iapd's VmRSS and RssShmem from /proc:
after start, with the sessions open and idle, and after a round trip of 64 KiB through each
(which touches a part of each ring). The rings are shared memory (RssShmem); the goal is about
the rest: under 64 MiB with 64 sessions.

Usage: tools/checks/bench/daemon-memory.py [--iapd PATH] [--sessions N]
"""
import argparse, array, json, mmap, os, socket, struct, subprocess, sys, tempfile, time

def rss(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssShmem", "RssFile"):
                fields[key] = int(value.split()[0])
    return fields

def send(sock, message_id, request):
    body = json.dumps({"id": message_id, "request": request}).encode()
    sock.sendall(struct.pack(">I", len(body)) + body)

def receive(sock, buffer):
    """The next message and the descriptors that came with its bytes."""
    descriptors = []
    while True:
        if len(buffer) >= 4:
            length = struct.unpack(">I", bytes(buffer[:4]))[0]
            if len(buffer) >= 4 + length:
                message = json.loads(bytes(buffer[4:4 + length]))
                del buffer[:4 + length]
                return message, descriptors
        fds = array.array("i")
        data, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(4 * fds.itemsize))
        if not data:
            raise SystemExit("iapd closed the connection")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        descriptors += list(fds)
        buffer += data

def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iapd", default=".build/release/iapd")
    parser.add_argument("--sessions", type=int, default=64)
    options = parser.parse_args()
    work = tempfile.mkdtemp(prefix="iapd-memory-")
    profile = {"identity": {"name": "Many", "model": "M1", "manufacturer": "Test", "serialNumber": "M-1",
                            "firmwareVersion": "1.0", "hardwareVersion": "A"},
               "protocols": [{"name": f"com.example.echo{i}", "behaviour": "echo"} for i in range(options.sessions)]}
    with open(f"{work}/many.json", "w") as file:
        json.dump(profile, file)
    path = f"{work}/iapd.sock"
    daemon = subprocess.Popen([options.iapd, "--socket", path, "--no-usb", f"--simulate={work}/many.json"], stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if os.path.exists(path):
                break
            time.sleep(0.05)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        buffer = bytearray()
        send(sock, 1, {"hello": {"version": 3, "client": "daemon-memory"}})
        welcome, _ = receive(sock, buffer)
        accessories = welcome["reply"]["welcome"]["accessories"]
        while not accessories:
            message, _ = receive(sock, buffer)
            if "connected" in message["reply"]:
                accessories = [message["reply"]["connected"]["_0"]]
        accessory = accessories[0]["id"]
        start = rss(daemon.pid)
        sessions = []
        for i in range(options.sessions):
            send(sock, 10 + i, {"open": {"accessory": accessory, "protocolString": f"com.example.echo{i}"}})
            message, fds = receive(sock, buffer)
            if "opened" not in message["reply"] or len(fds) != 2:
                raise SystemExit(f"open {i}: {message}")
            size = os.fstat(fds[1]).st_size
            memory = mmap.mmap(fds[1], size)
            os.close(fds[1])
            sessions.append((fds[0], memory))
        opened = rss(daemon.pid)
        # 64 KiB through each session's ring 0 (client → accessory) and back (ring 1): the
        # producer's tail at 64, the consumer's head at 128 + 256 for ring 1; capacity at 16.
        chunk = 64 * 1024
        for wake, memory in sessions:
            capacity = struct.unpack_from("<Q", memory, 16)[0]
            memory[4096:4096 + chunk] = bytes(range(256)) * (chunk // 256)
            struct.pack_into("<Q", memory, 64, chunk)
            os.write(wake, b"\x01")
        for wake, memory in sessions:
            deadline = time.time() + 30
            while struct.unpack_from("<Q", memory, 64 + 256)[0] < chunk and time.time() < deadline:
                time.sleep(0.01)
            tail = struct.unpack_from("<Q", memory, 64 + 256)[0]
            struct.pack_into("<Q", memory, 128 + 256, tail)
        moved = rss(daemon.pid)
        print(json.dumps({"sessions": options.sessions, "kiB": {"start": start, "open": opened, "after64KiBEach": moved}}))
        for label, figures in (("start", start), (f"{options.sessions} sessions open", opened), ("after 64 KiB each way through each", moved)):
            print(f"iapd {label}: VmRSS {figures['VmRSS'] / 1024:.1f} MiB "
                  f"(anonymous {figures.get('RssAnon', 0) / 1024:.1f}, shared rings {figures.get('RssShmem', 0) / 1024:.1f}, "
                  f"files {figures.get('RssFile', 0) / 1024:.1f})")
    finally:
        daemon.terminate()
        daemon.wait(timeout=10)

if __name__ == "__main__":
    main()
