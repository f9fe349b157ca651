"""CUDA on sim: torch.cuda in a Python rank of a simulated node.

Code written for a GPU node runs here as it is: `torch.cuda.set_device(LOCAL_RANK)`,
tensors on `cuda:N`, `init_process_group("nccl")`, `DDP(device_ids=[...])`, autocast,
streams and events, the memory figures. The C++ side (NOTE [CUDA on sim] in
sim/cuda/sim_cuda.h) makes torch's cuda device type the node's GPUs, served by the CPU:
tensors, kernels, the device guard, the CUDA hooks, memory. This module puts torch's Python
entry points that call the CUDA runtime directly (torch._C._cuda_*, torch.cuda's streams
and events) over it, turns "nccl" into sgpu's simulated transport, and makes what cannot
be simulated (CUDA graphs, IPC, NVML, compiled GPU kernels) fail naming itself.

It acts in a rank of the sim backend with SGPU_SIM_CUDA on (the default), once torch is
imported: install() runs from the worker after it binds the device, and from the torch
import hook (sgpu._runtime) in a program's rank.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys

import _sgpu_rank_env as _rank_env

from sgpu import errors

_served = False
_fractions: dict = {}
# torch's range of stream priorities on a GPU, (least, greatest) as
# torch.cuda.Stream.priority_range() gives it: CUDA's own is (0, -5) on every GPU sgpu
# simulates, which torch narrows to the levels of its stream pools (0 to -3).
_PRIORITY_RANGE = (0, -3)
_priorities: dict = {}  # a simulated stream's (device, id) -> its priority, where it is not 0


def served() -> bool:
    """True once this process's cuda devices are the simulated node's GPUs."""
    return _served


def on_node() -> bool:
    """Whether this process lives on a simulated node without being a rank of a sim launch:
    SGPU_BACKEND was sim when its interpreter started (`sgpu sim`, a notebook kernel
    started so, what such a process starts), or it called sgpu.simulate()."""
    if _rank_env.ROLE in os.environ or os.environ.get(_rank_env.RANK_DIR):
        return False  # a rank, a fork server: each sees to itself
    if _simulated:
        return True
    startup = sys.modules.get("_sgpu_startup")
    return bool(getattr(startup, "ON_NODE", False))


_said_neither: list = []  # SGPU_SIM_CUDA's value said on stderr, once a process


def _sim_cuda_on() -> bool:
    """SGPU_SIM_CUDA as the option table reads it (on where unset). A word that is neither on
    nor off is said on stderr once, and serves nothing: this runs as torch is imported, in
    every process on the node, which it must not stop."""
    from sgpu import _native
    from sgpu.errors import ConfigError

    try:
        return _native.environment_flag("sim_cuda", True)
    except ConfigError as e:
        if not _said_neither:
            _said_neither.append(True)
            print(f"sgpu: {e}; this process's cuda devices are not the simulated node's",
                  file=sys.stderr, flush=True)
        return False


def wanted() -> bool:
    """Whether this process's cuda devices are to be a simulated node's (it may not be yet):
    a rank of a sim launch, or a process on the node (on_node())."""
    if not _sim_cuda_on():
        return False
    # A fork server's ranks serve cuda themselves.
    if os.environ.get(_rank_env.ROLE) == _rank_env.FORK_SERVER_ROLE:
        return False
    if os.environ.get(_rank_env.RANK_DIR):
        return os.environ.get(_rank_env.RANK_BACKEND) == _rank_env.SIM_BACKEND
    return on_node()


_simulated = False  # sgpu.simulate() was called here


def simulate(node: str | None = None) -> None:
    """Puts this process on a simulated node (`node`, a spec such as "8xH100"; SGPU_SIM,
    else 8xH100, when None): torch's cuda devices become the node's GPUs, now if torch is
    imported, else as soon as it is; calls of distributed functions from here run on it, and
    so does every process started from here after this call. In a process whose cuda
    devices already are the node's, a different node is refused (ConfigError)."""
    global _simulated
    if _rank_env.ROLE in os.environ or os.environ.get(_rank_env.RANK_DIR):
        raise errors.ConfigError(
            "sgpu.simulate() is for a process that sgpu did not start (a notebook's kernel, a "
            "test session): this is a rank of an sgpu launch, which is on its node already")
    from sgpu import _native

    current = _native.node_spec()  # the environment's node, else the default
    spec = node or current
    _native.check_node_spec(spec)  # ConfigError naming the bad part, nothing changed
    if _served and spec != current:
        raise errors.ConfigError(
            f"this process is on the simulated node {current} already (torch's cuda devices "
            f"are its GPUs); it cannot move to {spec}: call sgpu.simulate() before the first "
            "use of cuda, or restart the process")
    torch = sys.modules.get("torch")
    if not _served and torch is not None and torch.cuda.is_initialized():
        raise errors.ConfigError(
            "torch's cuda devices are this machine's already (CUDA was initialised before "
            "sgpu.simulate()); call it before the first use of cuda, or restart the process")
    os.environ[_rank_env.BACKEND_SETTING] = _rank_env.SIM_BACKEND
    os.environ[_rank_env.SIM_NODE_SETTING] = spec
    _simulated = True
    if torch is not None:
        install()


def install() -> bool:
    """Serves cuda in this rank (torch must be imported): False where the backend does not
    (cuda ranks, SGPU_SIM_CUDA=off, outside a sim rank). Once per process."""
    global _served
    if _served:
        return True
    if not wanted():
        return False
    from sgpu import _native

    if on_node():
        _native.join_node()
    if not _native.serve_cuda():
        return False
    ledger = _native.node_memory_name()  # what the processes started from here share
    if ledger:
        os.environ[_rank_env.NODE_MEMORY] = ledger
    import torch

    count = len(_native.cuda_devices())
    _patch_device_calls(torch, _native, count)
    _patch_streams(torch, _native)
    _patch_memory(torch, _native, count)
    _patch_storage(torch, _native)
    _patch_distributed()
    _patch_not_simulated(torch)
    _patch_extensions(torch, _native)
    _patch_sync_batch_norm(torch)
    _served = True
    if not on_node():
        # A rank uses its GPU from its start: what torch queued (seeds, capability checks)
        # runs now. A process on the node initialises CUDA at its first use, as on a GPU
        # node, so that what it forks before then may use CUDA (MultiProcessTestCase).
        torch.cuda._lazy_init()
    os.register_at_fork(after_in_child=_after_fork_in_child)
    return True


def not_simulated(api: str, why: str) -> errors.NotSimulatedError:
    return errors.NotSimulatedError(
        f"{api} {why}, so it cannot run on simulated GPUs (CUDA on sim runs torch's "
        "operators on the CPU). Run this code on the cuda backend (a GPU node), or keep "
        f"{api} out of what runs on sim"
    )


# What CUDA's compute-capability table gives every GPU of a capability (the CUDA C++
# Programming Guide, "Compute Capabilities"): (threads per SM, shared memory per SM, shared
# memory a block may opt in to).
_PER_CAPABILITY = {(7, 0): (2048, 98304, 98304), (7, 5): (1024, 65536, 65536),
                   (8, 0): (2048, 167936, 166912), (8, 6): (1536, 102400, 101376),
                   (8, 9): (1536, 102400, 101376), (9, 0): (2048, 233472, 232448),
                   (10, 0): (2048, 233472, 232448), (10, 3): (2048, 233472, 232448)}


class _DeviceProperties:
    """What torch.cuda.get_device_properties() says of a simulated GPU: the type's figures
    (src/backend/gpu_type.cc's table, and CUDA's per capability); `simulated` is True, and
    the repr is a GPU's. Clock rates and the memory bus are 0: not modelled."""

    def __init__(self, facts: dict):
        self.name = facts["name"]
        self.major = facts["major"]
        self.minor = facts["minor"]
        self.multi_processor_count = facts["multi_processor_count"]
        self.total_memory = facts["total_memory"]
        self.is_integrated = 0
        self.is_multi_gpu_board = 0
        threads, shared, optin = _PER_CAPABILITY.get((self.major, self.minor),
                                                     (2048, 0, 49152))
        self.max_threads_per_multi_processor = threads
        self.regs_per_multiprocessor = 65536  # every capability from 5.0 on
        self.gcnArchName = facts["name"]
        self.warp_size = 32
        self.uuid = f"00000000-0000-0000-0000-{facts['index']:012d}"
        self.pci_bus_id = facts["index"] + 1
        self.pci_device_id = 0
        self.pci_domain_id = 0
        self.L2_cache_size = facts["l2_cache_size"]
        self.clock_rate = 0
        self.memory_clock_rate = 0
        self.memory_bus_width = 0
        self.shared_memory_per_block = 49152
        self.shared_memory_per_block_optin = optin
        self.shared_memory_per_multiprocessor = shared
        self.type = facts["type"]
        self.simulated = True

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid}, "
            f"pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
            f"pci_domain_id={self.pci_domain_id}, "
            f"L2_cache_size={self.L2_cache_size // (1024 * 1024)}MB)"
        )


def _patch_device_calls(torch, native, count: int) -> None:
    devices = [_DeviceProperties(facts) for facts in native.cuda_devices()]

    def cuda_init():
        torch.cuda.default_generators = native.cuda_generators(count)
        torch.cuda._get_device_properties = lambda index: devices[index]

    def set_device(index):
        if index >= 0:
            native.cuda_set_device(index)

    C = torch._C
    C._cuda_init = cuda_init
    C._cuda_getDeviceCount = lambda: count
    C._cuda_getDevice = native.cuda_current_device
    C._cuda_setDevice = set_device
    C._cuda_exchangeDevice = native.cuda_exchange_device
    C._cuda_maybeExchangeDevice = native.cuda_exchange_device
    C._cuda_synchronize = lambda: None
    C._cuda_canDeviceAccessPeer = lambda device, peer: device != peer
    C._cuda_isInBadFork = lambda: False
    # torch.cuda keeps its own names for these.
    torch.cuda._exchange_device = native.cuda_exchange_device
    torch.cuda._maybe_exchange_device = native.cuda_exchange_device
    torch.cuda._is_in_bad_fork = lambda: torch._C._cuda_isInBadFork()
    torch.cuda._device_count_nvml = lambda: -1
    torch.cuda._device_count_amdsmi = lambda: -1
    torch.cuda._cached_device_count = None
    import torch.cuda.graphs as graphs

    graphs._cuda_isCurrentStreamCapturing = lambda: False
    C._cuda_isCurrentStreamCapturing = lambda: False


def _event_class(torch):
    class EventType(type):
        def __instancecheck__(cls, obj) -> bool:
            return isinstance(obj, torch.Event) and obj.device.type == "cuda"

    class Event(metaclass=EventType):
        """torch.cuda.Event on a simulated GPU: a torch.Event on cuda (torch's methods take
        no subclass of it), recorded when issued; elapsed_time() is the wall clock's between
        two records."""

        def __new__(cls, enable_timing=False, blocking=False, interprocess=False, external=False):
            if interprocess:
                raise not_simulated("torch.cuda.Event(interprocess=True)", "is CUDA IPC")
            return torch.Event(device="cuda", enable_timing=enable_timing, blocking=blocking)

        @classmethod
        def from_ipc_handle(cls, device, handle):
            raise not_simulated("torch.cuda.Event.from_ipc_handle", "is CUDA IPC")

    return Event


def _patch_streams(torch, native) -> None:
    Event = _event_class(torch)

    class Stream(torch.Stream):
        """torch.cuda.Stream on a simulated GPU: work is done when it is issued, so a stream
        orders nothing and every wait returns at once. Its priority is kept, as a GPU's
        stream pools keep it (in the range), though here it orders nothing either."""

        def __new__(cls, device=None, priority=0, **kwargs):
            if kwargs.get("stream_id") is not None:
                return super().__new__(cls, **kwargs)
            with torch.cuda.device(device):
                index = torch.cuda.current_device()
            stream = super().__new__(cls, device=torch.device("cuda", index), priority=priority)
            # A priority out of the range is the nearest in it, as torch's stream pools give.
            least, greatest = _PRIORITY_RANGE
            clamped = min(max(priority, greatest), least)
            if clamped:
                _priorities[(index, stream.stream_id)] = clamped
            return stream

        @property
        def priority(self) -> int:
            return _priorities.get((self.device_index, self.stream_id), 0)

        @staticmethod
        def priority_range() -> tuple:
            return _PRIORITY_RANGE

        def wait_event(self, event) -> None:
            event.wait(self)

        def wait_stream(self, stream) -> None:
            self.wait_event(stream.record_event())

        def record_event(self, event=None):
            event = Event() if event is None else event
            event.record(self)
            return event

        def query(self) -> bool:
            return True

        def synchronize(self) -> None:
            pass

        @property
        def cuda_stream(self) -> int:
            return self.stream_id

        def __repr__(self) -> str:
            return f"<torch.cuda.Stream device={self.device} cuda_stream={self.stream_id:#x}>"

    class ExternalStream(Stream):
        def __new__(cls, stream_ptr, device=None, **kwargs):
            raise not_simulated("torch.cuda.ExternalStream", "wraps a stream of the CUDA runtime")

    def set_stream(stream_id=0, device_index=0, device_type=1):
        native.cuda_set_stream(stream_id, device_index, device_type)

    C = torch._C
    C._cuda_getCurrentStream = native.cuda_current_stream
    C._cuda_getDefaultStream = native.cuda_default_stream
    C._cuda_setStream = set_stream
    import torch.cuda.streams as streams

    for module in (torch.cuda, streams):
        module.Stream = Stream
        module.Event = Event
        module.ExternalStream = ExternalStream


def _nested(flat: dict) -> dict:
    """sgpu's flat figures ("allocated_bytes.all.peak") as torch._C._cuda_memoryStats nests
    them, which torch.cuda.memory_stats() flattens back."""
    out: dict = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = out
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return out


def _patch_memory(torch, native, count: int) -> None:
    def device_index(device=None) -> int:
        if device is None:
            return -1
        return torch.cuda._get_device_index(device, optional=True)

    def memory_stats(device):
        return _nested(native.cuda_memory_stats(device_index(device)))

    def empty_cache():
        for index in range(count):
            native.cuda_empty_cache(index)

    def set_fraction(fraction, device):
        index = device_index(device)
        if index < 0:
            index = native.cuda_current_device()
        native.cuda_set_memory_fraction(fraction, index)
        _fractions[index] = fraction

    def get_fraction(device):
        index = device_index(device)
        return _fractions.get(native.cuda_current_device() if index < 0 else index, 1.0)

    def mem_get_info(device=None):
        index = device_index(device)
        if index < 0:
            index = native.cuda_current_device()
        total = torch.cuda.get_device_properties(index).total_memory
        total = int(total * _fractions.get(index, 1.0))
        free = native.cuda_free_memory(index)  # every process on the node counted
        if free is None:
            free = total - native.cuda_memory_stats(index).get("reserved_bytes.all.current", 0)
        return max(free, 0), total

    def snapshot(*args, **kwargs):
        return {"segments": [], "device_traces": [[] for _ in range(count)]}

    C = torch._C
    C._cuda_memoryStats = memory_stats
    C._cuda_resetPeakMemoryStats = lambda device: native.cuda_reset_peak_memory_stats(
        device_index(device)
    )
    C._cuda_resetAccumulatedMemoryStats = lambda device: (
        native.cuda_reset_accumulated_memory_stats(device_index(device))
    )
    C._cuda_emptyCache = empty_cache
    C._cuda_setMemoryFraction = set_fraction
    C._cuda_getMemoryFraction = get_fraction
    C._cuda_memorySnapshot = snapshot
    C._cuda_record_memory_history = lambda *args, **kwargs: None
    C._cuda_record_memory_history_legacy = lambda *args, **kwargs: None
    import torch.cuda.memory as memory

    for module in (torch.cuda, memory):
        module.mem_get_info = mem_get_info


def _patch_storage(torch, native) -> None:
    # A cuda tensor's storage is host memory whose own device is the CPU's (NOTE [CUDA on
    # sim]): torch.save's location, storage.device and storage.is_cuda ask it this way.
    base_device = torch._C.StorageBase.device

    def storage_device(self):
        index = native.cuda_storage_device(self)
        return torch.device("cuda", index) if index >= 0 else base_device.__get__(self)

    torch.UntypedStorage.device = property(storage_device)

    # torch makes a cuda storage with CUDA's caching allocator itself (torch.load's
    # restore, storage.cuda()): a simulated one comes from a cuda tensor's.
    make = torch._C.StorageBase.__new__

    def new_storage(cls, *args, device=None, **kwargs):
        if device is None or torch.device(device).type != "cuda" or cls is not torch.UntypedStorage:
            return make(cls, *args, **({"device": device} if device is not None else {}), **kwargs)
        size = args[0] if args and isinstance(args[0], int) else 0
        storage = torch.empty(size, dtype=torch.uint8, device=device).untyped_storage()
        if args and not isinstance(args[0], int):  # a sequence of bytes
            data = torch.UntypedStorage(*args, **kwargs)
            storage = torch.empty(len(data), dtype=torch.uint8, device=device).untyped_storage()
            storage.copy_(data)
        return storage

    torch.UntypedStorage.__new__ = new_storage


def _patch_distributed() -> None:
    """"nccl" (alone, or a device's in "cpu:gloo,cuda:nccl", or the default's for cuda) is
    sgpu's simulated transport, through the "sgpu" backend, so the recorder, the fault plan,
    the hang verdicts and the accounting act on it; dist.get_backend() still says what it
    would say on a node."""
    import torch.distributed as dist

    if not dist.is_available():
        return
    from torch.distributed import distributed_c10d as c10d

    from sgpu import _process_group

    _process_group.register_backend()
    _patch_hash_tensors()
    original = c10d._new_process_group_helper
    signature = inspect.signature(original)

    @functools.wraps(original)
    def new_process_group_helper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        backend = bound.arguments["backend"]
        translated = _simulated_backend(c10d, backend)
        if translated is None:
            return original(*args, **kwargs)
        bound.arguments["backend"] = c10d.Backend(translated)
        bound.arguments["backend_options"] = None  # NCCL's options mean nothing here
        _process_group.making_nccl.on = True  # the simulated backend holds it to NCCL's rules
        try:
            pg, prefix_store = original(*bound.args, **bound.kwargs)
        finally:
            _process_group.making_nccl.on = False
        if not isinstance(pg, c10d.ProcessGroup):
            return pg, prefix_store  # GroupMember.NON_GROUP_MEMBER: not in this group
        if "," not in str(backend or "") and ":" not in str(backend or ""):
            # One backend named (or none, NCCL's on a node): the group's default is the
            # simulated one, as NCCL is the default of a node's "nccl" group, so that c10d
            # finds it (hasHooks() warned of a missing default backend otherwise).
            pg._set_default_backend(c10d.ProcessGroup.BackendType.CUSTOM)
        if pg in c10d._world.pg_map:
            c10d._world.pg_map[pg] = (backend, prefix_store)
            c10d._world.pg_backend_config[pg] = str(c10d.BackendConfig(backend))
        return pg, prefix_store

    c10d._new_process_group_helper = new_process_group_helper


def _patch_hash_tensors() -> None:
    """torch.distributed's DETAIL debug level hashes an object collective's bytes with a CUDA
    kernel of its own, outside the dispatcher, only to log the hash: here a hash of the
    same bytes from the CPU."""
    import hashlib

    import torch

    def hash_tensors(tensors) -> int:
        digest = hashlib.blake2b(digest_size=8)
        for tensor in tensors:
            digest.update(tensor.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        return int.from_bytes(digest.digest(), "little")

    torch._C._distributed_c10d._hash_tensors = hash_tensors


def _simulated_backend(c10d, backend):
    """The backend spec with "nccl" made "sgpu"; None when it names no NCCL."""
    mapping = c10d.BackendConfig(c10d.Backend(backend) if backend else c10d.Backend.UNDEFINED)
    devices = mapping.get_device_backend_map()
    if "nccl" not in devices.values():
        return None
    return ",".join(
        f"{device}:{'sgpu' if name == 'nccl' else name}" for device, name in devices.items()
    )


def _raiser(api: str, why: str):
    def fail(*args, **kwargs):
        raise not_simulated(api, why)

    return fail


def _patch_not_simulated(torch) -> None:
    import torch.cuda.graphs as graphs

    class CUDAGraph:
        def __new__(cls, *args, **kwargs):
            raise not_simulated("torch.cuda.CUDAGraph", "captures and replays CUDA kernels")

    for module in (torch.cuda, graphs):
        module.CUDAGraph = CUDAGraph
        module.graph = _raiser("torch.cuda.graph", "captures CUDA kernels")
        module.make_graphed_callables = _raiser(
            "torch.cuda.make_graphed_callables", "captures CUDA kernels"
        )
        module.graph_pool_handle = _raiser("torch.cuda.graph_pool_handle", "is a CUDA graph pool")
    for name in ("utilization", "temperature", "power_draw", "clock_rate", "memory_usage",
                 "device_memory_used", "list_gpu_processes"):
        if hasattr(torch.cuda, name):
            setattr(torch.cuda, name, _raiser(f"torch.cuda.{name}", "asks NVML about the GPU"))
    torch.cuda.caching_allocator_alloc = _raiser(
        "torch.cuda.caching_allocator_alloc", "hands out a raw pointer into GPU memory")
    torch.cuda.caching_allocator_delete = _raiser(
        "torch.cuda.caching_allocator_delete", "frees a raw pointer into GPU memory")
    import torch.cuda.jiterator as jiterator

    for name in ("_create_jit_fn", "_create_multi_output_jit_fn"):
        setattr(jiterator, name, _raiser(f"torch.cuda.jiterator.{name}",
                                         "compiles a CUDA kernel from its source"))
    torch.UntypedStorage._share_cuda_ = _raiser(
        "Sending a cuda tensor to another process (CUDA IPC)", "shares GPU memory by handle"
    )
    _patch_comm(torch)
    _patch_cudnn(torch)
    _patch_profiler(torch)
    _patch_compile(torch)


def _patch_profiler(torch) -> None:
    """torch.profiler starts Kineto's CUPTI side wherever torch sees CUDA, and here CUPTI
    finds no GPU and says so on every rank (CUPTI_ERROR_UNKNOWN, "gpuGetDeviceCount
    failed"): Kineto's own messages are left out (KINETO_LOG_LEVEL above its errors'),
    unless the user set the level. A simulated GPU's operators appear as the CPU work they
    are; the profile's CUDA times are 0."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")


def _patch_cudnn(torch) -> None:
    """No cuDNN serves a simulated GPU: torch takes its native kernels, whose CPU ones run
    (convolutions already do, the hooks saying so). cudnn.version() answers with the version
    this torch was built against, as on a node, and is_acceptable() says no, so that an RNN
    takes torch's native path rather than cuDNN's, whose fused LSTM and GRU cells sim
    serves itself (NOTE [RNN cells on sim] in sim/cuda/rnn_cells.cc)."""
    import torch.backends.cudnn as cudnn

    major, minor, patch = torch._C._cudnn.getCompileVersion()
    built = major * 10000 + minor * 100 + patch if major >= 9 else major * 1000 + minor * 100 + patch
    cudnn.version = lambda: built
    cudnn.is_acceptable = lambda tensor: False


def _patch_comm(torch) -> None:
    """torch.cuda.comm (nn.DataParallel's copies between the GPUs of one process) as copies
    between simulated GPUs: a copy to each, a sum on one, chunks to each, a concatenation
    on one, with each function's signature and results."""
    import torch.cuda.comm as cuda_comm
    import torch.nn.parallel.comm as parallel_comm

    def device_of(device) -> torch.device:
        if device is None:
            return torch.device("cuda", torch.cuda.current_device())
        if isinstance(device, int):
            return torch.device("cpu") if device == -1 else torch.device("cuda", device)
        return torch.device(device)

    def broadcast(tensor, devices=None, *, out=None):
        if out is not None:
            for target in out:
                target.copy_(tensor)
            return tuple(out)
        return tuple(tensor if tensor.device == device_of(d) else tensor.to(device_of(d))
                     for d in devices)

    def broadcast_coalesced(tensors, devices, buffer_size=10485760):
        return tuple(tuple(t if t.device == device_of(d) else t.to(device_of(d)) for t in tensors)
                     for d in devices)

    def reduce_add(inputs, destination=None):
        target = device_of(destination)
        total = inputs[0].to(target, copy=True)
        for other in inputs[1:]:
            total.add_(other.to(target))
        return total

    def reduce_add_coalesced(inputs, destination=None, buffer_size=10485760):
        return tuple(reduce_add(list(same), destination) for same in zip(*inputs))

    def scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
        if out is not None:
            parts = tensor.split([o.size(dim) for o in out], dim)
            for target, part in zip(out, parts):
                target.copy_(part)
            return tuple(out)
        parts = (tensor.split(list(chunk_sizes), dim) if chunk_sizes is not None
                 else tensor.chunk(len(devices), dim))
        return tuple(part.to(device_of(d)).contiguous() for part, d in zip(parts, devices))

    def gather(tensors, dim=0, destination=None, *, out=None):
        if out is not None:
            return torch.cat([t.to(out.device) for t in tensors], dim, out=out)
        target = device_of(destination)
        return torch.cat([t.to(target) for t in tensors], dim)

    for module in (cuda_comm, parallel_comm):
        for function in (broadcast, broadcast_coalesced, reduce_add, reduce_add_coalesced,
                         scatter, gather):
            setattr(module, function.__name__, function)


def _patch_compile(torch) -> None:
    """torch.compile's backends compile GPU kernels (Triton) for cuda inputs: a compiled
    function given cuda tensors fails naming torch.compile; CPU inputs compile as usual."""
    compile_ = torch.compile

    @functools.wraps(compile_)
    def compile(model=None, *, backend="inductor", mode=None, options=None, **kwargs):
        if mode is None and options is None:
            real = backend
        elif backend == "inductor":
            real = torch._TorchCompileInductorWrapper(mode, options, kwargs.get("dynamic"))
        else:
            real = torch._TorchCompileWrapper(backend, mode, options, kwargs.get("dynamic"))

        def simulated(gm, example_inputs):
            if any(getattr(x, "is_cuda", False) for x in example_inputs):
                raise not_simulated(
                    f"torch.compile (backend {backend!r})", "compiles GPU kernels for cuda inputs"
                )
            compiler = torch._dynamo.lookup_backend(real) if isinstance(real, str) else real
            return compiler(gm, example_inputs)

        simulated.__name__ = f"sim_{backend if isinstance(backend, str) else 'backend'}"
        return compile_(model, backend=simulated, **kwargs)

    torch.compile = compile
    # Inductor asks Triton's CUDA driver about the GPU whenever cuda looks available, even to
    # compile for the CPU; Triton itself is what cannot run here.
    import torch.utils._triton as triton_utils

    triton_utils.has_triton = lambda: False
    triton_utils.has_triton_package = lambda: False

    from sgpu import _imports

    def patch_triton(jit) -> None:
        jit.JITFunction.run = _raiser("A Triton kernel", "is compiled for and launched on a GPU")

    _imports.after_import("triton.runtime.jit", patch_triton)


def _patch_extensions(torch, native) -> None:
    """Operators a library registers after install() (torch.ops.load_library, a C++ extension
    built with torch.utils.cpp_extension) get the CPU path, or fail naming themselves when
    they have only a CUDA kernel."""
    load_library = torch.ops.load_library

    @functools.wraps(load_library)
    def load(path):
        load_library(path)
        native.serve_cuda()  # served already: covers the operators registered since

    torch.ops.load_library = load

    def patch_cpp_extension(cpp_extension):
        for name in ("load", "load_inline"):
            original = getattr(cpp_extension, name)

            def covered(*args, _original=original, **kwargs):
                module = _original(*args, **kwargs)
                native.serve_cuda()
                return module

            setattr(cpp_extension, name, functools.wraps(original)(covered))

    from sgpu import _imports

    _imports.after_import("torch.utils.cpp_extension", patch_cpp_extension)


_LIBRARIES: list = []  # the torch.library registrations this module made, kept alive


def _patch_sync_batch_norm(torch) -> None:
    """The kernels SyncBatchNorm calls, which torch has for CUDA only (batch_norm_stats,
    batch_norm_gather_stats_with_counts, batch_norm_elemt, batch_norm_backward_reduce,
    batch_norm_backward_elemt), on simulated GPUs: the same statistics, from torch's
    operators, in float32 for half inputs, as CUDA's kernels accumulate them."""
    import warnings

    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():  # replacing the CUDA kernels is the point here
        warnings.simplefilter("ignore")
        for name, kernel in _sync_batch_norm_kernels(torch).items():
            lib.impl(name, kernel, "CUDA")
    _LIBRARIES.append(lib)


def _sync_batch_norm_kernels(torch) -> dict:
    def channels(x, like):  # a per-channel vector, shaped to broadcast over `like`
        return x.reshape([1, -1] + [1] * (like.dim() - 2))

    def reduced(x):
        return [0] + list(range(2, x.dim()))

    def stats(input, eps):
        x = input.float()
        var = x.var(reduced(x), unbiased=False)
        return x.mean(reduced(x)), torch.rsqrt(var + eps)

    def gather(input, mean, invstd, running_mean, running_var, momentum, eps, counts):
        counts = counts.to(mean.dtype).reshape(-1, 1)
        total = counts.sum()
        mean_all = (counts * mean).sum(0) / total
        var_i = 1.0 / (invstd * invstd) - eps
        # The parallel Welford merge, as CUDA's kernel combines the ranks' statistics.
        var = (counts * (var_i + (mean - mean_all) ** 2)).sum(0) / total
        with torch.no_grad():
            if running_mean is not None:
                running_mean.mul_(1 - momentum).add_(momentum * mean_all.to(running_mean.dtype))
            if running_var is not None:
                unbiased = var * total / (total - 1)
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        return mean_all, torch.rsqrt(var + eps)

    def elemt(input, weight, bias, mean, invstd, eps):
        out = (input.float() - channels(mean, input)) * channels(invstd, input)
        if weight is not None:
            out = out * channels(weight.float(), input)
        if bias is not None:
            out = out + channels(bias.float(), input)
        return out.to(input.dtype)

    def backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
        dy = grad_out.float()
        sum_dy = dy.sum(reduced(dy))
        sum_dy_xmu = (dy * (input.float() - channels(mean, input))).sum(reduced(dy))
        empty = grad_out.new_empty(0)
        like = weight if weight is not None else sum_dy
        grad_weight = (sum_dy_xmu * invstd).to(like.dtype) if weight_g else empty
        grad_bias = sum_dy.to(like.dtype) if bias_g else empty
        return (sum_dy, sum_dy_xmu, grad_weight, grad_bias) if input_g else (
            empty, empty, grad_weight, grad_bias)

    def backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
        total = count.sum().float()
        xmu = input.float() - channels(mean, input)
        scale = channels(invstd, input) * (channels(weight.float(), input) if weight is not None
                                           else 1.0)
        grad = (grad_out.float() - channels(sum_dy / total, input)
                - xmu * channels(invstd * invstd * sum_dy_xmu / total, input)) * scale
        return grad.to(input.dtype)

    return {"batch_norm_stats": stats, "batch_norm_gather_stats_with_counts": gather,
            "batch_norm_elemt": elemt, "batch_norm_backward_reduce": backward_reduce,
            "batch_norm_backward_elemt": backward_elemt}


def _after_fork_in_child() -> None:
    # As on a node: CUDA does not survive a fork (a DataLoader worker) once initialised; the
    # child of a process that had not initialised it may (a test's forked ranks).
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if torch.cuda.is_initialized():
        torch._C._cuda_isInBadFork = lambda: True
        torch.cuda._initialized = False
    else:
        from sgpu import _native

        _native.count_in_forked_child()
