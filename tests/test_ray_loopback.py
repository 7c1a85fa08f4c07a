"""A local Ray started by the search listens on the loopback only (issue 18 item 5): every
listening TCP socket of every process it started (GCS, raylet, agents, workers, this driver's
own server) is on 127.0.0.1 or ::1."""
import ipaddress
import os
import sys
from pathlib import Path

import pytest

from bnn.search.evaluators import RayEvaluator

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="reads listening sockets from /proc (Linux only)")


def _descendants(root: int) -> set[int]:
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent[int(entry)] = int(text[text.rindex(")") + 2:].split()[1])
    out, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


def _socket_owners(pids) -> dict[int, int]:
    """socket inode -> pid, from the processes' open descriptors."""
    owners = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[int(target[8:-1])] = pid
    return owners


def _address(hex_address: str) -> ipaddress._BaseAddress:
    # /proc/net/tcp{,6}: the address in 32-bit words, each in host (little-endian) order.
    raw = bytes.fromhex(hex_address)
    return ipaddress.ip_address(b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)))


def _listening(owners: dict[int, int]) -> list[tuple[int, ipaddress._BaseAddress, int]]:
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], int(fields[9])
            if state == "0A" and inode in owners:  # 0A: TCP_LISTEN
                host, port = local.split(":")
                out.append((owners[inode], _address(host), int(port, 16)))
    return out


def _loopback(ip) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def test_a_local_ray_listens_on_the_loopback_only():
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ev = RayEvaluator("synthetic:1", {"epochs": 3}, workers=1, address=None)
    try:
        ev.submit({"seq": 0, "genome": "0-0-0-0-0-0-1", "reject_below": None})
        [(seq, res)] = ev.poll()  # an actor process exists and has served a task
        assert seq == 0 and res["status"] == "ok", res
        assert ray.nodes()[0]["NodeManagerAddress"] in ("127.0.0.1", "::1")
        pids = _descendants(os.getpid()) | {os.getpid()}
        sockets = _listening(_socket_owners(pids))
        names = {_name(pid) for pid, _, _ in sockets}
        # The check can fail: Ray's servers were found listening (on whatever address).
        assert {"gcs_server", "raylet"} <= names, sockets
        public = [(_name(pid), str(ip), port) for pid, ip, port in sockets if not _loopback(ip)]
        assert not public, f"Ray listens on non-loopback addresses: {public}"
    finally:
        ev.close()
        ray.shutdown()
