"""A slow link between two network namespaces made for the run: veth pair + `tc tbf` rate limit each way.

    [ns bsb-cli-PID]  client tools  --veth, tbf RATE each way-->  [ns bsb-srv-PID]  delay relay -> Azurite (lo)

Both addresses live only on the veth inside these two namespaces, which have no other interface and no route
anywhere else: traffic cannot leave them. The namespaces (and the veth with them) are deleted on exit, also on
error or Ctrl-C (and by an atexit hook if the benchmark is interrupted harder).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from harness.azurite import BenchError
from harness.measure import die_with_parent, kill_group, tail

SRV_ADDR = "10.231.77.1"  # inside our own server namespace only
CLI_ADDR = "10.231.77.2"  # inside our own client namespace only
RELAY_PORT = 10000


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise BenchError(f"`ip {' '.join(args)}` failed: {r.stderr.strip()}")


def _tc(ns: str, *args: str) -> None:
    r = subprocess.run(["ip", "netns", "exec", ns, "tc", *args], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise BenchError(f"`tc {' '.join(args)}` in {ns} failed: {r.stderr.strip()}")


class SlowLink:
    def __init__(self, rate_mbit: float, delay_ms: float, workdir: Path, python: str = sys.executable) -> None:
        self.rate_mbit = rate_mbit
        self.delay_ms = delay_ms
        self.workdir = workdir
        self.python = python
        tag = os.getpid()
        self.cli, self.srv = f"bsb-cli-{tag}", f"bsb-srv-{tag}"
        self.veth_cli, self.veth_srv = f"bsbc{tag}"[:15], f"bsbs{tag}"[:15]
        self.relay: subprocess.Popen[bytes] | None = None
        self._made: list[str] = []

    @property
    def endpoint(self) -> str:
        """The blob endpoint as the client namespace sees it (the relay in front of Azurite)."""
        return f"http://{SRV_ADDR}:{RELAY_PORT}/devstoreaccount1"

    def up(self, azurite_port: int) -> None:
        atexit.register(self.down)
        try:
            for ns in (self.cli, self.srv):
                _ip("netns", "add", ns)
                self._made.append(ns)
                _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "add", self.veth_cli, "netns", self.cli, "type", "veth", "peer", "name", self.veth_srv,
                "netns", self.srv)  # fmt: skip
            for ns, dev, addr in ((self.cli, self.veth_cli, CLI_ADDR), (self.srv, self.veth_srv, SRV_ADDR)):
                _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                # tbf: RATE each way; a burst of 64 KiB and a queue of up to 50 ms of data, as a real bottleneck.
                _tc(ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_mbit:g}mbit",
                    "burst", "64kb", "latency", "50ms")  # fmt: skip
            self._start_relay(azurite_port)
        except BaseException:
            self.down()
            raise

    def _start_relay(self, azurite_port: int) -> None:
        log = self.workdir / "relay.log"
        relay = str(Path(__file__).resolve().parent / "tcpproxy.py")
        cmd = ["ip", "netns", "exec", self.srv, self.python, relay, SRV_ADDR, str(RELAY_PORT), "127.0.0.1",
               str(azurite_port), "--delay-ms", f"{self.delay_ms:g}"]  # fmt: skip
        with log.open("wb") as out:
            self.relay = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          start_new_session=True, preexec_fn=die_with_parent)  # fmt: skip
        deadline = time.monotonic() + 30
        while "relay ready" not in tail(log):
            if self.relay.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the delay relay did not start:\n{tail(log)}")
            time.sleep(0.05)  # start-up polling interval

    def down(self) -> None:
        relay, self.relay = self.relay, None
        if relay is not None:
            kill_group(relay.pid)
            relay.wait()
        while self._made:
            ns = self._made.pop()
            with contextlib.suppress(BenchError):
                _ip("netns", "delete", ns)  # takes its end of the veth (and so the pair) with it
        with contextlib.suppress(Exception):
            atexit.unregister(self.down)


def netns_available() -> str:
    """Empty if namespaces and tbf can be used here, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode != 0:
            return f"{tool} not installed (iproute2)"
    return ""
