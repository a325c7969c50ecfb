"""The bump allocator behind the fused MoE's scratch buffers, and its use in the Triton path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    dtypes_for_device,
    lora_context,
    lora_mapping,
    make_lora,
    make_routing,
    make_weights,
    make_x,
    reference_output,
    rel_err,
)
from moe_policy.experts.triton import fused_moe as triton_moe  # noqa: E402
from moe_policy.experts.triton.workspace import Workspace  # noqa: E402


def _inside(view: torch.Tensor, buf: torch.Tensor) -> bool:
    lo, hi = buf.data_ptr(), buf.data_ptr() + buf.numel() * buf.element_size()
    return lo <= view.data_ptr() and view.data_ptr() + view.numel() * view.element_size() <= hi


def test_views_are_aligned_disjoint_and_typed():
    """Views come from the buffer, 16-byte aligned, one after the other, in the asked dtype."""
    buf = torch.empty(1000, dtype=torch.bfloat16)
    ws = Workspace(buf)
    a = ws.take((3,), torch.int32)
    b = ws.take((2, 5), torch.float32)
    assert a.dtype == torch.int32 and b.shape == (2, 5) and b.dtype == torch.float32
    assert _inside(a, buf) and _inside(b, buf)
    assert a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0
    assert b.data_ptr() >= a.data_ptr() + 12  # no overlap
    a.fill_(7)
    b.fill_(1.5)
    assert a.tolist() == [7, 7, 7] and float(b.sum()) == 15.0
    assert ws.carved == 12 + 40


def test_falls_back_to_new_tensors():
    """Without a buffer, or once it is used up, take allocates; a strided buffer is refused."""
    buf = torch.empty(16, dtype=torch.float32)  # 64 bytes
    ws = Workspace(buf)
    first = ws.take((16,), torch.int32)
    extra = ws.take((4,), torch.int32)
    assert _inside(first, buf) and not _inside(extra, buf)
    assert ws.carved == 64
    none = Workspace(None, torch.device("cpu")).take((2, 3), torch.float32)
    assert none.shape == (2, 3) and none.device.type == "cpu"
    with pytest.raises(ValueError, match="contiguous"):
        Workspace(torch.empty(4, 4)[:, :2])


@pytest.mark.parametrize(("k", "with_lora"), [(2, False), (2, True), (1, True)])
def test_fused_moe_keeps_scratch_in_its_output(k, with_lora, device, monkeypatch):
    """With k > 1 the routing tables and LoRA shrink outputs are carved out of the output
    buffer (nothing with k = 1, whose GEMM 2 writes the output); results match the reference."""
    carved = []

    class Recording(Workspace):
        def take(self, shape, dtype):
            t = super().take(shape, dtype)
            carved.append(self.carved)
            return t

    monkeypatch.setattr(triton_moe, "Workspace", Recording)
    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 64, 32, k, "silu")
    wts = make_weights(cfg, dtype, device)
    x = make_x(40, 64, dtype, device)
    tw, ti = make_routing(40, 8, k, device, seed=4)
    ctx = None
    if with_lora:
        ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
        ctx = lora_context(ad, lora_mapping(40, "some_none", 2, device))
    backend = triton_moe.TritonExperts(cfg, wts["w13"], wts["w2"])
    out = backend.apply(x, tw, ti, ctx)
    assert carved, "the launcher allocated nothing through the workspace"
    assert (carved[-1] > 0) == (k > 1)
    if ctx is None:
        ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)
        assert rel_err(out, ref) < 3e-3
    else:  # same result as the same call with every scratch buffer freshly allocated
        monkeypatch.setattr(triton_moe, "Workspace", lambda buf, dev: Workspace(None, dev))
        assert torch.equal(out, backend.apply(x, tw, ti, ctx))
