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
this mode, moves no bytes for fake tensors. The ranks do not wait for each other there.
"""

import contextlib

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

_KERNELS = {"cpu": torch._C.DispatchKeySet(torch._C.DispatchKey.CPU),
            "cuda": torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)}
_RANGES = {torch.ops.aten.arange.default, torch.ops.aten.arange.start,
           torch.ops.aten.arange.start_step, torch.ops.aten.range.default}


def _is_fake(value) -> bool:
    return isinstance(value, FakeTensor)


def _runs_for_real(func, args, kwargs) -> bool:
    """Bookkeeping stays real: an operator on real tensors only (a device mesh's rank map,
    token ids, a batch the loader read, what DDP compares of its parameters' shapes), and
    a factory of integers (arange over ints, an integer dtype). A floating factory (the
    weights of a module, activations) is fake, so a model of any size runs without its
    bytes."""
    leaves = pytree.tree_leaves((args, kwargs))
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    if tensors:
        return not any(_is_fake(t) for t in tensors)
    dtype = kwargs.get("dtype")
    if dtype is not None:
        return not (dtype.is_floating_point or dtype.is_complex)
    return func in _RANGES and all(isinstance(a, (int, bool)) for a in args)


class _Dispatch(TorchDispatchMode):
    """Every c10d operation to its process group's backend, past the fake tensors'
    kernels; host bookkeeping for real; every other operator to the fake tensor mode."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            # The kernel of the tensors' device, which asks the group for that device's
            # backend, as it would for real tensors.
            first = next((leaf for leaf in pytree.tree_leaves(args)
                          if isinstance(leaf, torch.Tensor)), None)
            device = first.device.type if first is not None else "cpu"
            if device not in _KERNELS:
                raise NotImplementedError(
                    f"sgpu: {func} on {device} tensors: shape-only compute runs collectives "
                    "of cpu and cuda tensors")
            return func.redispatch(_KERNELS[device], *args, **kwargs)
        if _runs_for_real(func, args, kwargs):
            with _disable_current_modes():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


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
def shapes_only():
    """Tensors made inside are fake (shapes, no data); collectives reach sgpu's groups.
    Tensors made before (the function's arguments) may be used as they are."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with _swappable(mode), mode, _Dispatch():
        yield
