"""One way to observe a forward (issue 46): `CaiT.forward` and its blocks take what timm's take, and
`forward_insights` reads the same pass with hooks that leave nothing behind and hear only their own thread."""

from __future__ import annotations

import inspect
import threading

import pytest
import timm.models.cait as timm_cait
import torch
from conftest import randomise_

import cait
from cait import model as ours


def _parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize(
    "name", ["TalkingHeadAttn", "ClassAttn", "LayerScaleBlock", "LayerScaleBlockClassAttn", "CaiT"]
)
def test_forward_takes_what_timms_takes(name):
    theirs = getattr(timm_cait, "Cait" if name == "CaiT" else name)
    assert _parameters(getattr(ours, name).forward) == _parameters(theirs.forward)
    if name == "CaiT":
        assert _parameters(ours.CaiT.forward_features) == _parameters(theirs.forward_features)


@pytest.fixture(scope="module")
def model():
    return randomise_(cait.load_model("cait_pico_32", weights=False).model).eval()


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_insights_are_the_plain_forward_and_leave_no_hooks(model):
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ins = model.forward_insights(x, sa_layers=(0, 1), raw_attention=True)
        torch.testing.assert_close(ins.logits, model(x), rtol=0, atol=0)
    assert _hooks(model) == 0
    with pytest.raises(RuntimeError, match="stop"), torch.no_grad():
        model.forward_insights(x, sa_layers=(0,), sa_reduce=lambda *maps: (_ for _ in ()).throw(RuntimeError("stop")))
    assert _hooks(model) == 0, "a pass that raised left its hooks on the model"


def test_a_plain_forward_in_another_thread_is_not_observed(model):
    """The app's server shares a model between threads: another thread's forward while the hooks are open
    must not add class-attention rows or ratios to this pass's record."""
    x = torch.randn(2, 3, 32, 32)

    def other_thread_runs_a_forward(before, after):
        worker = threading.Thread(target=lambda: model(torch.randn(5, 3, 32, 32)))
        worker.start()
        worker.join()
        return after.shape

    with torch.no_grad():
        ins = model.forward_insights(x, sa_layers=(0,), sa_reduce=other_thread_runs_a_forward)
    cfg = model.cfg
    assert len(ins.class_attention) == cfg.depth_token_only
    assert all(a.shape[0] == 2 for a in ins.class_attention)
    assert {k: tuple(v.shape) for k, v in ins.residual_ratios.items()} == {
        "sa": (2, cfg.depth),
        "ffn": (2, cfg.depth),
        "ca": (2, cfg.depth_token_only),
        "ca_ffn": (2, cfg.depth_token_only),
    }


def test_every_blocks_residual_ratios_are_branch_over_residual_norms(model):
    """Each SA and CA block's attention and MLP ratios against the pass rewritten by hand from the blocks'
    parts (branch norm over the norm of the stream it is added to, per token, averaged over the tokens)."""
    x = torch.randn(2, 3, 32, 32)

    def ratio(branch: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
        return (branch.norm(dim=-1) / stream.norm(dim=-1)).mean(dim=1)

    expected: dict[str, list[torch.Tensor]] = {"sa": [], "ffn": [], "ca": [], "ca_ffn": []}
    with torch.no_grad():
        got = model.forward_insights(x).residual_ratios
        tokens = model.patch_embed(x) + model.pos_embed
        for blk in model.blocks:
            attn = blk.gamma_1 * blk.attn(blk.norm1(tokens))
            expected["sa"].append(ratio(attn, tokens))
            mlp = blk.gamma_2 * blk.mlp(blk.norm2(tokens + attn))
            expected["ffn"].append(ratio(mlp, tokens + attn))
            tokens = tokens + attn + mlp
        cls = model.cls_token.expand(2, 1, -1)
        for blk in model.blocks_token_only:
            attn = blk.gamma_1 * blk.attn(blk.norm1(torch.cat((cls, tokens), dim=1)))
            expected["ca"].append(ratio(attn, cls))
            mlp = blk.gamma_2 * blk.mlp(blk.norm2(cls + attn))
            expected["ca_ffn"].append(ratio(mlp, cls + attn))
            cls = cls + attn + mlp
    for kind, ratios in expected.items():
        torch.testing.assert_close(got[kind], torch.stack(ratios, dim=1), msg=kind)
