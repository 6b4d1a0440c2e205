"""Custom autograd Functions called without torch's per-call argument binding (`eager_apply`).

The 8-bit layers' Functions define `setup_context` (and `generate_vmap_rule`) so that
torch.func.vmap runs them. For such a Function, every `.apply` binds the call's arguments with
inspect.signature. Their eager form here skips that; under vmap the Function itself runs.
"""
from __future__ import annotations

import torch


def eager_apply(cls: type[torch.autograd.Function]):
    """`cls.apply` without torch's per-call argument binding.

    For a Function with `setup_context` (needed for vmap), torch binds every call's arguments with
    inspect.signature: about 0.2 ms a call on this CPU, a fifth of a small 8-bit model's step
    (tens of thousands of calls per run). Outside torch.func transforms this calls an equivalent
    old-style Function (forward(ctx, ...) running cls.forward then cls.setup_context, the same
    backward); under vmap it calls cls.apply. All arguments must be positional. A class may define
    `eager_forward(ctx, *args)`, its forward and setup_context in one, for this eager form alone.
    """
    def forward(ctx, *args):
        out = cls.forward(*args)
        cls.setup_context(ctx, args, out)
        return out

    eager = type(cls.__name__ + "Eager", (torch.autograd.Function,),
                 {"forward": staticmethod(getattr(cls, "eager_forward", forward)),
                  "backward": staticmethod(cls.backward)})
    transforms_active = torch._C._are_functorch_transforms_active

    def apply(*args):
        return cls.apply(*args) if transforms_active() else eager.apply(*args)

    return apply
