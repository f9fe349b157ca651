"""A call on a machine whose /etc/hosts is the distribution's own asks no DNS server
anything (NOTE [Store peers' names]): c10d names each store connection, which it opens over
IPv6 to the IPv4-mapped ::ffff:127.0.0.1, and no stock hosts file names that address.

The call runs in network and mount namespaces this test creates: only a loopback, Debian's
stock /etc/hosts, and an /etc/resolv.conf whose one server is a counter on 127.0.0.1:53 that
answers every query REFUSED and writes down its name. Needs root (CI runs as root); skipped
elsewhere, and ci/test prints why."""

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from sgpu_cli import SGPU
# Debian's, with the machine's name on 127.0.1.1 as its installer writes it (Gloo looks the
# host name up).
STOCK_HOSTS = ("127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n"
               "::1\t\tlocalhost ip6-localhost ip6-loopback\n")

DRIVER = textwrap.dedent(r"""
    import json, os, socket, subprocess, sys, threading

    queries = []
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 53))

    def name_of(packet):
        labels, at = [], 12
        while at < len(packet) and packet[at]:
            labels.append(packet[at + 1:at + 1 + packet[at]].decode(errors="replace"))
            at += 1 + packet[at]
        return ".".join(labels)

    def answer():
        while True:
            packet, sender = server.recvfrom(4096)
            if packet == b"stop":
                return
            queries.append(name_of(packet))
            flags = bytes([0x80 | (packet[2] & 0x01), 0x05])  # a response: REFUSED
            server.sendto(packet[:2] + flags + packet[4:], sender)

    thread = threading.Thread(target=answer)
    thread.start()
    import sgpu

    @sgpu.distributed(gpus=4, gpu_type="H100", tracking=False)
    def train():
        import torch
        import torch.distributed as dist
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        total = torch.ones(1, device="cuda")
        dist.all_reduce(total)
        dist.destroy_process_group()
        return int(total.item())

    results = train.distributed()
    program = os.path.join(os.path.dirname(sys.argv[1]), "program.py")
    with open(program, "w") as f:
        f.write("import torch.distributed as dist\n"
                "dist.init_process_group('gloo')\ndist.barrier()\n")
    ran = subprocess.run([sys.argv[1], "run", "--gpus", "2", "--", sys.executable, program],
                         capture_output=True, text=True, timeout=120)
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"stop", ("127.0.0.1", 53))
    thread.join()
    print(json.dumps({"results": results, "run": ran.returncode, "run_err": ran.stderr[-2000:],
                      "queries": queries}))
""")


def isolated(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip to give the call a network and an /etc/hosts of its own")
    hosts = tmp_path / "hosts"
    hosts.write_text(STOCK_HOSTS.format(name=socket.gethostname()))
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    return ["unshare", "--net", "--mount", "sh", "-c",
            f"ip link set lo up && mount --bind {hosts} /etc/hosts && "
            f"mount --bind {resolv} /etc/resolv.conf && exec \"$@\"", "sh"]


@pytest.mark.skipif(not os.access(SGPU, os.X_OK), reason="SGPU_CLI names no sgpu binary")
def test_a_call_and_sgpu_run_ask_no_dns_server_with_the_stock_hosts_file(tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    done = subprocess.run(isolated(tmp_path) + [sys.executable, str(driver), SGPU],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["results"] == [4, 4, 4, 4]
    assert seen["run"] == 0, seen["run_err"]
    assert seen["queries"] == []
