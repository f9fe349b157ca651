"""Shape-only compute on sim (docs/simulation.md, "Shape-only compute").

With sim_compute="shapes" (or SGPU_SIM_COMPUTE=shapes) a Python rank runs its function
under torch's FakeTensorMode: every floating tensor it makes carries a shape, a dtype and
a device (cuda:N as on the node) and no data, so a model of any size runs its control flow
on a CPU. Values do not exist: `.item()` or a shape that depends on data raise torch's
DataDependentOutputException naming the operator, never a made-up number. Bookkeeping
(operators on real tensors only, factories of integers) stays real.

Collectives are the point. torch answers a collective on fake tensors with a fake Work
and never reaches the process group; here each c10d operation goes to the kernel of its
tensors' device instead, which calls the group's backend, where sgpu's recorder counts and
times it from the tensors' shapes as it would a real one, and the transport beneath, in
this mode, moves no bytes for fake tensors; the ranks still meet there and compare what
they called (MovingNoBytes in sim/process_group.cc).

Each operator the function runs on its GPU is also timed (NOTE [The compute model] in
src/model/platform.h): its FLOPs by torch's flop counter's formulas (matmuls,
convolutions, attention), the bytes it reads and writes in the GPU's memory, and the
roofline of the node's platform over both, added up per rank (`handle.compute_stats()`,
`sgpu.compute_stats()` inside the rank).
"""

import contextlib
import functools
import os
import threading

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes, is_traceable_wrapper_subclass
from torch.utils.flop_counter import flop_registry
from torch.utils.weak import WeakIdKeyDictionary

_KERNELS = {"cpu": torch._C.DispatchKeySet(torch._C.DispatchKey.CPU),
            "cuda": torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)}
# Functional collectives (the _c10d_functional_autograd ones have autograd kernels only,
# which call these).
_FUNCTIONAL = {"_c10d_functional", "_dtensor"}
# Factories whose result is integers when no dtype is given.
_INTEGER_FACTORIES = {torch.ops.aten.randint, torch.ops.aten.randperm}
_RANGES = {torch.ops.aten.arange.default, torch.ops.aten.arange.start,
           torch.ops.aten.arange.start_step, torch.ops.aten.range.default}
# Operators that run no kernel over their tensors' memory: allocations, and aliases that
# torch does not mark as views. Not timed.
_NO_KERNEL = {torch.ops.aten.empty, torch.ops.aten.empty_like, torch.ops.aten.empty_strided,
              torch.ops.aten.new_empty, torch.ops.aten.new_empty_strided,
              torch.ops.aten.lift_fresh, torch.ops.aten.set_, torch.ops.aten.resize_,
              torch.ops.aten._unsafe_view, torch.ops.aten._reshape_alias,
              torch.ops.aten.alias, torch.ops.aten.detach}
_CONVOLUTIONS = {torch.ops.aten.convolution, torch.ops.aten._convolution,
                 torch.ops.aten.cudnn_convolution, torch.ops.aten.convolution_backward}


def _runs_for_real(func, args, kwargs, inside_fake: bool) -> bool:
    """Bookkeeping stays real: an operator on real tensors only (a device mesh's rank map,
    token ids, a batch the loader read, what DDP compares of its parameters' shapes), and
    a factory of integers (arange over ints, randint, randperm, an integer dtype). A
    floating factory (the weights of a module, activations) is fake, so a model of any size
    runs without its bytes. `inside_fake`: the operator is part of a fake operator's own
    implementation (a decomposition's empty tensor for `.long()` of a fake tensor), whose
    result depends on fake data: it stays fake, whatever its dtype."""
    leaves = pytree.tree_leaves((args, kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if tensors:
        return not any(isinstance(t, FakeTensor) for t in tensors)
    if inside_fake:
        return False
    dtype = kwargs.get("dtype")
    if dtype is not None:
        return not (dtype.is_floating_point or dtype.is_complex)
    if func._overloadpacket in _INTEGER_FACTORIES:
        return True
    return func in _RANGES and all(isinstance(a, (int, bool)) for a in args)


def _moved_bytes(tensor: torch.Tensor) -> int:
    """What a kernel reads or writes of `tensor`: its elements, a broadcast dimension
    (stride 0) once."""
    numel = 1
    for size, stride in zip(tensor.shape, tensor.stride()):
        if stride != 0:
            numel *= size
    return numel * tensor.element_size()


_aten = torch.ops.aten
# A matmul's operands: (first, second) positions of its m x k and k x n matrices.
_MATMULS = {_aten.mm: (0, 1), _aten.addmm: (1, 2), _aten.bmm: (0, 1), _aten.baddbmm: (1, 2)}
_ATTENTION = {_aten._scaled_dot_product_flash_attention,
              _aten._scaled_dot_product_flash_attention_backward,
              _aten._scaled_dot_product_efficient_attention,
              _aten._scaled_dot_product_efficient_attention_backward,
              _aten._scaled_dot_product_cudnn_attention,
              _aten._scaled_dot_product_cudnn_attention_backward,
              _aten._flash_attention_forward, _aten._flash_attention_backward,
              _aten._efficient_attention_forward, _aten._efficient_attention_backward}


def _kernel_shape(func, args) -> dict:
    """What the kernel model needs beyond the flops (NOTE [The kernel model] in
    src/model/kernels.h): a matmul's batch, output rows and columns and inner size; that an
    operator is an attention kernel."""
    packet = func._overloadpacket
    if packet in _ATTENTION:
        return {"kind": "attention"}
    operands = _MATMULS.get(packet)
    if operands is None:
        return {}
    a, b = args[operands[0]], args[operands[1]]
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() != b.dim():
        return {}
    batch = a.shape[0] if a.dim() == 3 else 1
    return {"kind": "matmul", "batch": float(batch), "m": float(a.shape[-2]),
            "n": float(b.shape[-1]), "k": float(a.shape[-1])}


def _compute_dtype(func, outputs) -> str:
    """The dtype whose peak times the operator: its first floating output's, float32 as
    "tf32" where torch lets cuBLAS (matmuls) or cuDNN (convolutions) run it on tensor
    cores."""
    dtype = next((t.dtype for t in outputs if t.dtype.is_floating_point), torch.float32)
    if dtype == torch.float32 and func._overloadpacket in flop_registry:
        if func._overloadpacket in _CONVOLUTIONS:
            tf32 = torch.backends.cudnn.allow_tf32
        else:
            tf32 = torch.backends.cuda.matmul.allow_tf32
        if tf32:
            return "tf32"
    return str(dtype).removeprefix("torch.")


def _attention_on_gpu(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                      scale=None, enable_gqa=False):
    """scaled_dot_product_attention as torch runs it on a GPU of compute capability 8.0 or
    later (every simulated type): flash attention for float16 and bfloat16, memory-
    efficient attention for float32, each where its constraints hold (no mask, the same
    heads in query, key and value, head sizes in eights, up to 256 for flash), and the
    torch.backends.cuda switches (torch.nn.attention.sdpa_kernel) allow it. None where
    torch would take the math path, or where the fused one needs what this does not model
    (a mask, grouped-query heads): the math path then runs, as torch's own choice on fake
    tensors always does, which materialises every attention matrix: a GPU's step would
    take less memory and time."""
    if not (isinstance(query, FakeTensor) and query.device.type == "cuda"):
        return None
    cuda = torch.backends.cuda
    head = query.shape[-1]
    if (attn_mask is not None or not query.dim() == key.dim() == value.dim() == 4
            or key.shape[-1] != head or value.shape[-1] != head or head % 8 != 0
            or not query.shape[1] == key.shape[1] == value.shape[1]):
        return None
    aten = torch.ops.aten
    if query.dtype in (torch.float16, torch.bfloat16) and head <= 256 and cuda.flash_sdp_enabled():
        return aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale)[0]
    if query.dtype == torch.float32 and cuda.mem_efficient_sdp_enabled():
        grad = query.requires_grad or key.requires_grad or value.requires_grad
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, None, grad, dropout_p, is_causal, scale=scale)[0]
    return None


@contextlib.contextmanager
def _attention_as_on_gpu():
    """scaled_dot_product_attention picks its kernel in C++ from the device type, before
    any operator reaches a dispatch mode: it is picked as on the GPU (_attention_on_gpu)
    instead. Not through a torch function mode: the autograd engine runs a cuda device's
    backward in a thread of its own, where an activation-checkpointed block recomputes its
    forward, and modes are the thread's own."""
    sdpa = torch._C._nn.scaled_dot_product_attention

    def as_on_gpu(*args, **kwargs):
        fused = _attention_on_gpu(*args, **kwargs)
        return sdpa(*args, **kwargs) if fused is None else fused

    torch._C._nn.scaled_dot_product_attention = as_on_gpu
    torch.nn.functional.scaled_dot_product_attention = as_on_gpu
    try:
        yield
    finally:
        torch._C._nn.scaled_dot_product_attention = sdpa
        torch.nn.functional.scaled_dot_product_attention = sdpa


class _ShapesMode(FakeTensorMode):
    """torch's fake tensor mode, but: every c10d operation goes to its process group's
    backend, past the fake tensors' kernels; bookkeeping runs for real; and each new fake
    storage on a cuda device is counted by that device's memory model. Being the fake mode
    itself, it sees the operators a tensor subclass runs on its local tensors too (a
    DTensor's: FSDP2's optimizer step)."""

    def __init__(self):
        super().__init__(allow_non_fake_inputs=True)
        from sgpu import _native

        self._count = _native.count_fake_storage
        self._time = _native.count_compute
        # Each thread's dispatches under way (backward runs in the autograd engine's own):
        # only the outermost operator is timed.
        self._dispatching = threading.local()
        # A fake storage on cuda -> [its device, what its bytes hold of the model (None
        # while resized to nothing)]; an entry goes, and its bytes with it, with the storage.
        self.held = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d" or func.namespace in _FUNCTIONAL:
            return self.collective(func, args, kwargs)
        depth = getattr(self._dispatching, "depth", 0)
        if _runs_for_real(func, args, kwargs, inside_fake=depth > 0):
            with _disable_current_modes():
                return func(*args, **kwargs)
        self._dispatching.depth = depth + 1
        try:
            out = super().__torch_dispatch__(func, types, args, kwargs)
        finally:
            self._dispatching.depth = depth
        if depth > 0:
            # An operator inside one that the fake kernels decompose (log_softmax into max,
            # exp, sum, log): the GPU runs the outer one's kernel, which makes its outputs
            # and none of these temporaries.
            return out
        self.timed(func, args, kwargs, out)
        for leaf in pytree.tree_leaves(out):
            if isinstance(leaf, FakeTensor) and leaf.device.type == "cuda":
                storage = leaf.untyped_storage()
                if storage not in self.held:
                    self.held[storage] = [leaf.device.index, None]
                    self.counted(storage, storage.nbytes(), func)
        return out

    def collective(self, func, args, kwargs):
        """A c10d operation goes to the kernel of its tensors' device, which asks the group
        for that device's backend, as it would for real tensors. A functional collective
        (torch.distributed._functional_collectives: a DTensor's redistribution, tensor
        parallelism's) runs torch's own kernel for the device with this mode on: the
        output it makes is a fake tensor of this GPU's memory, the collective it issues is
        a c10d operation that comes back here, and its wait (wait_tensor) waits for that
        collective's Work, as on the node. Their fake kernels would answer with no
        collective at all. A tensor subclass among the arguments (a functional
        collective's AsyncCollectiveTensor) unwraps itself first, as it would with no mode
        on: the group's backend takes tensors."""
        tensors = [leaf for leaf in pytree.tree_leaves(args) if isinstance(leaf, torch.Tensor)]
        if any(is_traceable_wrapper_subclass(t) for t in tensors):
            return NotImplemented
        device = tensors[0].device.type if tensors else "cpu"
        if device not in _KERNELS:
            raise NotImplementedError(
                f"sgpu: {func} on {device} tensors: shape-only compute runs collectives "
                "of cpu and cuda tensors")
        if func.namespace == "c10d":
            return func.redispatch(_KERNELS[device], *args, **kwargs)
        with self:
            return func.redispatch(_KERNELS[device], *args, **kwargs)

    def timed(self, func, args, kwargs, out) -> None:
        """One operator on a GPU into the rank's compute estimate: its FLOPs, the bytes it
        reads and writes. A view, an allocation and a question of a tensor's metadata
        (prim.device, an operator that returns no tensor) run no kernel: not timed."""
        if func.is_view or func._overloadpacket in _NO_KERNEL:
            return
        outputs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if not outputs:
            return
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if not any(t.device.type == "cuda" for t in inputs + outputs):
            return
        formula = flop_registry.get(func._overloadpacket)
        flops = formula(*args, **kwargs, out_val=out) if formula is not None else 0
        moved = sum(_moved_bytes(t) for t in inputs) + sum(_moved_bytes(t) for t in outputs)
        self._time(str(func._overloadpacket), _compute_dtype(func, outputs), float(flops),
                   float(moved), **_kernel_shape(func, args))

    def counted(self, storage, size: int, where) -> None:
        """The storage's bytes now `size` in its device's model (CUDA's out-of-memory
        error, naming `where`, past the device's capacity)."""
        entry = self.held[storage]
        entry[1] = None  # what it held goes first, as the caching allocator frees then allocates
        if size > 0:
            try:
                entry[1] = self._count(entry[0], size)
            except torch.OutOfMemoryError as error:
                raise torch.OutOfMemoryError(f"{error} (shape-only compute, at {where})") from None


@contextlib.contextmanager
def _functional_collectives_eager():
    """A functional collective returns, in eager, a tensor that waits for its collective at
    its first use (AsyncCollectiveTensor), so that compute issued before overlaps it; where
    torch traces a program it waits at once, and torch takes any fake tensor mode for a
    tracer's. Shape-only compute runs the program eagerly: its mode is not taken for one."""
    from torch.distributed import _functional_collectives as funcol

    tracing = funcol._are_we_tracing
    fake = torch._C._TorchDispatchModeKey.FAKE

    def tracing_but_for_shapes() -> bool:
        if not isinstance(torch._C._get_dispatch_mode(fake), _ShapesMode):
            return tracing()
        mode = torch._C._unset_dispatch_mode(fake)
        try:
            return tracing()
        finally:
            torch._C._set_dispatch_mode(mode)

    funcol._are_we_tracing = tracing_but_for_shapes
    try:
        yield
    finally:
        funcol._are_we_tracing = tracing


@contextlib.contextmanager
def _swappable(mode: FakeTensorMode):
    """`module.cuda()` and `.to(...)` swap each fake parameter for its converted copy, and
    torch refuses a swap of tensors that are weakly referenced, as the fake tensor mode's
    memo of converted tensors does every fake tensor made as a Parameter: the two leave
    the memo (a cache) just before they swap."""
    memo = mode.fake_tensor_converter.meta_converter.tensor_memo
    swap = torch.utils.swap_tensors

    def swap_unmemoized(t1, t2):
        for key in [key for key, value in list(memo.items()) if value is t1 or value is t2]:
            del memo[key]
        return swap(t1, t2)

    torch.utils.swap_tensors = swap_unmemoized
    try:
        yield
    finally:
        torch.utils.swap_tensors = swap


@contextlib.contextmanager
def _resizes_counted(mode: _ShapesMode):
    """FSDP frees an unsharded parameter's memory by resizing its storage to nothing and
    takes it again by resizing it back, outside any operator: each resize of a counted
    storage is counted."""
    resize = torch.UntypedStorage.resize_

    def counted_resize(storage, size):
        result = resize(storage, size)
        if storage in mode.held:
            mode.counted(storage, int(size), "UntypedStorage.resize_")
        return result

    torch.UntypedStorage.resize_ = counted_resize
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = resize


def _fake_leaf(value) -> FakeTensor | None:
    """A fake tensor among `value`'s containers (dicts, lists, tuples), a module's
    parameters and buffers, or an optimizer's state, or a DTensor's local shard, or None."""
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    elif isinstance(value, torch.optim.Optimizer):
        value = value.state_dict()
    for leaf in pytree.tree_leaves(value):
        leaf = getattr(leaf, "_local_tensor", leaf)  # a DTensor's shard
        if isinstance(leaf, FakeTensor):
            return leaf
        if isinstance(leaf, (torch.nn.Module, torch.optim.Optimizer)):
            found = _fake_leaf(leaf)
            if found is not None:
                return found
    return None


def _save_refused(api: str, fake: FakeTensor):
    """The NotSimulatedError for a save (`api`) of what holds the fake tensor `fake`."""
    from sgpu.errors import NotSimulatedError

    return NotSimulatedError(
        f"sgpu: {api} in shape-only compute: what it saves holds fake tensors (one of shape "
        f"{tuple(fake.shape)}, {fake.dtype} on {fake.device}), which have shapes and no "
        "values; nothing was written. Save in a run that computes values "
        '(sim_compute="values"), or skip the save in a dry run')


@contextlib.contextmanager
def _saves_refused():
    """torch.save opens its file before it pickles, so fake data would truncate the file it
    was given and fail half-way: a save of fake tensors is refused before the file is
    touched, and any other save is made whole in memory first, so that it never leaves a
    file half-written."""
    import io

    save = torch.save

    def refused(obj, f, *args, **kwargs):
        fake = _fake_leaf(obj)
        if fake is not None:
            raise _save_refused(f"torch.save({f!r})", fake)
        if not isinstance(f, (str, os.PathLike)):
            return save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        save(obj, buffer, *args, **kwargs)
        with open(f, "wb") as file:
            file.write(buffer.getbuffer())
        return None

    torch.save = refused
    try:
        yield
    finally:
        torch.save = save


@contextlib.contextmanager
def _objects_as_bookkeeping():
    """Object collectives (all_gather_object, broadcast_object_list: a loader's file lists,
    DCP's plans) are bookkeeping: their objects become byte tensors and back for real, and
    those tensors' collectives move their bytes."""
    from torch.distributed import distributed_c10d as c10d

    to_tensor, to_object = c10d._object_to_tensor, c10d._tensor_to_object

    def object_to_tensor(*args, **kwargs):
        with _disable_current_modes():
            return to_tensor(*args, **kwargs)

    def tensor_to_object(*args, **kwargs):
        with _disable_current_modes():
            return to_object(*args, **kwargs)

    c10d._object_to_tensor, c10d._tensor_to_object = object_to_tensor, tensor_to_object
    try:
        yield
    finally:
        c10d._object_to_tensor, c10d._tensor_to_object = to_tensor, to_object


@contextlib.contextmanager
def _callbacks_chain_on_the_host():
    """A collective's future completes with events on its GPU at the collective's predicted
    end (NOTE [The step's timeline]): a wait on it, and a callback added to it, wait there.
    torch's then() makes a future on the same GPUs, which finds its value's GPUs from the
    tensors' storages, and shapes have theirs on no GPU. Here then() chains on the host: the
    callback still runs after the collective's end, and its future holds no events, so a
    wait on it waits for nothing on the GPU."""
    then = torch._C.Future.then

    def chained(self, callback):
        future = torch.futures.Future()

        def run(done):
            try:
                future.set_result(callback(done))
            except Exception as error:  # the chained future holds it, as then()'s does
                future.set_exception(error)

        self.add_done_callback(run)
        return future

    torch._C.Future.then = chained
    try:
        yield
    finally:
        torch._C.Future.then = then


# Shape-only modes entered in this process, and not left: DCP's saves refuse while one is.
_entered = 0


def _refuse_checkpoints(dcp) -> None:
    """dcp.save and dcp.async_save of fake tensors are refused, naming what was fake, before
    a folder is made or a byte written: a dry run leaves no checkpoint that is not one."""
    def refusing(save, name):
        def refused(state_dict=None, *args, **kwargs):
            fake = _fake_leaf(state_dict) if _entered else None
            if fake is not None:
                raise _save_refused(f"torch.distributed.checkpoint.{name}", fake)
            return save(state_dict, *args, **kwargs)

        return functools.wraps(save)(refused)

    for name in ("save", "async_save"):
        setattr(dcp, name, refusing(getattr(dcp, name), name))


def _device_for(location: str, map_location) -> str:
    """Where torch.load puts a storage saved at `location`, for the map_location forms that
    name a device (a device, its text, a dict of locations); elsewhere, where it was saved."""
    if isinstance(map_location, (str, torch.device)):
        return str(map_location)
    if isinstance(map_location, dict):
        return map_location.get(location, location)
    return location


@contextlib.contextmanager
def _loads_integers():
    """torch.load under a fake mode gives every tensor a storage with no data, and an
    integer one (token ids, a step count) comes out neither fake nor readable: those are
    read for real, as bookkeeping is (floating ones stay fake: a model's weights cost no
    memory here). The file is read twice; the second time mmap'd where it can be."""
    load = torch.load

    def with_integers(f, map_location=None, *args, **kwargs):
        start = f.tell() if hasattr(f, "tell") else None
        loaded = load(f, map_location, *args, **kwargs)
        leaves, spec = pytree.tree_flatten(loaded)
        empty = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)
                 and not isinstance(leaf, FakeTensor) and leaf.device.type == "meta"]
        if not empty:
            return loaded
        if start is not None:
            f.seek(start)
        with _disable_current_modes():
            mmap = isinstance(f, (str, os.PathLike)) and "mmap" not in kwargs
            real = pytree.tree_leaves(load(f, "cpu", *args, **kwargs, **({"mmap": True} if mmap
                                                                             else {})))
            for i in empty:
                location = getattr(leaves[i].untyped_storage(), "_fake_device", "cpu")
                leaves[i] = real[i].to(_device_for(str(location), map_location))
        return pytree.tree_unflatten(leaves, spec)

    torch.load = with_integers
    try:
        yield
    finally:
        torch.load = load


_program = contextlib.ExitStack()
_checkpoints_watched: list = []  # after_import registered once a process


def enter_for_program() -> None:
    """A Python program that `sgpu run` runs in shape-only compute: from its import of
    torch to its end, as a function's rank runs inside shapes_only(). Its supervisor is
    told (a program in shapes that never gets here fails), and its GPU's memory figures
    and compute estimate are written when it ends, for the caller's summary."""
    import atexit

    from sgpu import _native

    _program.enter_context(shapes_only())
    _native.enter_program_shapes()
    atexit.register(_native.record_program_figures)


@contextlib.contextmanager
def shapes_only():
    """Tensors made inside are fake (shapes, no data); collectives reach sgpu's groups;
    the fake storages on cuda devices are their devices' memory. Tensors made before (the
    function's arguments) may be used as they are."""
    global _entered
    from sgpu import _imports

    if not _checkpoints_watched:
        _checkpoints_watched.append(True)
        _imports.after_import("torch.distributed.checkpoint", _refuse_checkpoints)
    mode = _ShapesMode()
    _entered += 1
    try:
        with _swappable(mode), _resizes_counted(mode), _attention_as_on_gpu(), _saves_refused(), \
                _loads_integers(), _objects_as_bookkeeping(), _functional_collectives_eager(), \
                _callbacks_chain_on_the_host(), mode:
            yield
    finally:
        _entered -= 1
