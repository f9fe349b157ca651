"""The decorator in a real Jupyter kernel (ipykernel, driven by jupyter_client): a cell
shows the ranks' output, an interrupt tears the ranks down, and a kernel shut down leaves
no rank behind."""

import os
import queue
import time

import pytest

from conftest import is_fork_server, processes_with_marker, wait_until

jupyter_client = pytest.importorskip("jupyter_client")

DEFINE = """
import time, sgpu

@sgpu.distributed(gpus=2, tracking=False)
def hello():
    print(f"hello from rank {sgpu.get_global_rank()}", flush=True)
    return sgpu.get_global_rank()

@sgpu.distributed(gpus=2, tracking=False)
def sleeps():
    time.sleep(120)
"""


@pytest.fixture
def kernel(tmp_path):
    marker = f"{os.getpid()}-{tmp_path.name}"
    env = dict(os.environ, SGPU_TEST_MARKER=marker)
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3", env=env)
    try:
        reply = client.execute_interactive(DEFINE, timeout=120)
        assert reply["content"]["status"] == "ok", reply["content"]
        yield manager, client, f"SGPU_TEST_MARKER={marker}"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def run_cell(client, code, timeout=120):
    """The cell's reply and everything it wrote to stdout."""
    out = []

    def on_output(message):
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
            out.append(message["content"]["text"])
        if message["msg_type"] == "execute_result":
            out.append(message["content"]["data"]["text/plain"])

    reply = client.execute_interactive(code, timeout=timeout, output_hook=on_output)
    return reply["content"], "".join(out)


def test_a_cell_shows_each_ranks_output_and_the_result(kernel):
    _, client, _ = kernel
    reply, out = run_cell(client, "hello.distributed()")
    assert reply["status"] == "ok", reply
    assert "[rank 0] hello from rank 0" in out and "[rank 1] hello from rank 1" in out
    assert "[0, 1]" in out


def test_a_tracked_call_shows_its_run_as_a_link(kernel):
    _, client, _ = kernel
    shown = []

    def on_output(message):
        if message["msg_type"] == "display_data":
            shown.append(message["content"]["data"].get("text/html", ""))

    code = "sgpu.distributed(gpus=1)(lambda: 0).distributed()"
    reply = client.execute_interactive(code, timeout=120, output_hook=on_output)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert len(shown) == 1 and '<a href="file://' in shown[0] and "MLflow run" in shown[0], shown


def test_an_interrupt_tears_the_ranks_down(kernel):
    manager, client, marker = kernel
    # stop_on_error=False: otherwise the kernel aborts, as the error's aftermath, a cell
    # that reaches it within its abort window, and the next cell below would race that.
    message_id = client.execute("sleeps.distributed()", stop_on_error=False)
    assert wait_until(lambda: len(processes_with_marker(marker)) >= 3)  # kernel + 2 ranks
    manager.interrupt_kernel()
    deadline = time.monotonic() + 60
    while True:
        reply = client.get_shell_msg(timeout=max(deadline - time.monotonic(), 0.1))
        if reply["parent_header"].get("msg_id") == message_id:
            break
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    kernel_pid = manager.provisioner.process.pid
    left = [p for p in processes_with_marker(marker) if p != kernel_pid and not is_fork_server(p)]
    assert left == []
    reply, out = run_cell(client, "hello.distributed()")  # the kernel goes on
    assert reply["status"] == "ok" and "[0, 1]" in out, (reply, out)


def test_shutting_the_kernel_down_leaves_no_rank(kernel):
    manager, client, marker = kernel
    reply, _ = run_cell(client, "handle = sleeps.launch()")
    assert reply["status"] == "ok", reply
    assert wait_until(lambda: len(processes_with_marker(marker)) >= 3)
    manager.shutdown_kernel(now=True)
    assert wait_until(lambda: processes_with_marker(marker) == [], limit=20)


NODE_CELL = """
import os, torch, sgpu

@sgpu.distributed(gpus=torch.cuda.device_count(), gpu_type="H100", tracking=False)
def train(epochs):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device(f"cuda:{local_rank}")
    torch.manual_seed(0)
    features = torch.randn(64, 10)
    dataset = TensorDataset(features, (features.sum(dim=1) > 0).long())
    sampler = DistributedSampler(dataset)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 2)).to(device), device_ids=[device])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in DataLoader(dataset, batch_size=2, sampler=sampler):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()
    return str(next(model.parameters()).device)

@sgpu.distributed(gpus=1, tracking=False)
def where():
    return str(torch.ones(1, device="cuda").device)

print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
print("plain", where())
print("ranks", train.distributed(2))
"""


def test_a_kernel_started_with_sgpu_backend_sim_is_on_the_simulated_node(kernel):
    """The notebook pattern @distributed(gpus=torch.cuda.device_count()) in a kernel started
    with SGPU_BACKEND=sim: 8 GPUs, a plain call on cuda:0, the seed's training on all 8."""
    _, client, _ = kernel
    reply, out = run_cell(client, NODE_CELL, timeout=300)
    assert reply["status"] == "ok", reply
    assert "gpus 8 NVIDIA H100 80GB HBM3" in out
    assert "plain cuda:0" in out
    assert "ranks " + str([f"cuda:{rank}" for rank in range(8)]) in out
