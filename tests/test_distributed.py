"""Distributed helpers: single-process fallbacks, and a real two-process gloo run of the gathered VTC loss.

The relation checked (see ``vlp.distributed``): with ``W`` ranks each holding ``B`` rows of a
``W * B`` batch, rank ``r``'s VTC loss is the mean of the one-process per-row losses of its rows, so
the mean over ranks equals the one-process loss; the gradient reaching each rank's local features
is ``W`` times the one-process gradient of those rows (the gather's backward sums over ranks); and
after DDP averages parameter gradients over ranks they equal the one-process parameter gradients.
"""

from __future__ import annotations

import faulthandler
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from vlp import distributed
from vlp.losses.contrastive import vtc_logits, vtc_loss

WORLD = 2
BATCH = 6  # global batch, BATCH // WORLD rows per rank
TEMP = 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _TwoTower(nn.Module):
    """Tiny projections + learnable temperature: enough to check parameter gradients through DDP."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.video_proj = nn.Linear(5, 4)
        self.text_proj = nn.Linear(3, 4)
        self.temp = nn.Parameter(torch.tensor(TEMP))

    def forward(self, video: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return F.normalize(self.video_proj(video), dim=-1), F.normalize(self.text_proj(text), dim=-1), self.temp


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(42)
    return torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 3, generator=g)


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)  # tiny tensors; two ranks on a 2-core machine
    faulthandler.dump_traceback_later(120, exit=True)  # a deadlock fails the test instead of hanging it
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD)
    )
    info = distributed.init_from_env("gloo", timeout_s=60)  # gloo also on a one-GPU machine
    assert info == distributed.DistInfo(rank, rank, WORLD, "gloo")
    assert distributed.is_dist() and distributed.rank() == rank and distributed.world_size() == WORLD
    assert distributed.init_from_env() == info  # idempotent
    video, text = _data()
    mine = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    model = distributed.wrap_ddp(_TwoTower())
    assert isinstance(model, nn.parallel.DistributedDataParallel)
    v, t, temp = model(video[mine], text[mine])
    v.retain_grad()
    t.retain_grad()
    loss = vtc_loss(v, t, temp, gather=distributed.all_gather_with_grad, rank=distributed.rank())
    loss.backward()
    gathered = distributed.all_gather_no_grad(torch.full((2, 3), float(rank)))
    mean_loss = distributed.all_reduce_mean(loss)
    distributed.barrier()
    tensors = {
        "loss": loss.detach(),
        "mean_loss": mean_loss,
        "v_grad": v.grad,
        "t_grad": t.grad,
        "gathered": gathered,
        **{f"p.{n}": p.grad for n, p in model.module.named_parameters()},
    }
    save_file({k: x.contiguous() for k, x in tensors.items()}, str(Path(out_dir) / f"rank{rank}.safetensors"))
    distributed.cleanup()
    assert not distributed.is_dist()
    distributed.cleanup()  # safe twice


def test_two_process_gloo_vtc_matches_one_process(tmp_path: Path) -> None:
    # forkserver: a fresh server process imports torch (and torch._dynamo, which DDP imports lazily,
    # ~7 s) once and forks both ranks from it. spawn would import everything once per rank (~30 s more
    # on 2 cores); plain fork from pytest is unsafe once the parent has run autograd on CUDA or an
    # OpenMP pool (children deadlock or refuse to run backward).
    mp.set_forkserver_preload(["torch", "torch._dynamo", "torch.nn.parallel"])
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True, start_method="forkserver")
    ranks = [load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(WORLD)]

    # one process on the concatenated batch
    model = _TwoTower()
    v, t, temp = model(*_data())
    v.retain_grad()
    t.retain_grad()
    loss = vtc_loss(v, t, temp)
    loss.backward()
    logits_v2t, logits_t2v = vtc_logits(v, t, temp)
    targets = torch.arange(BATCH)
    per_row = (
        F.cross_entropy(logits_v2t, targets, reduction="none") + F.cross_entropy(logits_t2v, targets, reduction="none")
    ) / 2

    b = BATCH // WORLD
    for r, out in enumerate(ranks):
        rows = slice(r * b, (r + 1) * b)
        torch.testing.assert_close(out["loss"], per_row[rows].mean().detach())
        torch.testing.assert_close(out["v_grad"], WORLD * v.grad[rows])
        torch.testing.assert_close(out["t_grad"], WORLD * t.grad[rows])
        torch.testing.assert_close(out["mean_loss"], loss.detach())
        for name, p in model.named_parameters():
            torch.testing.assert_close(out[f"p.{name}"], p.grad, msg=lambda m, name=name: f"{name}: {m}")
        expected = torch.cat([torch.zeros(2, 3), torch.ones(2, 3)])
        assert torch.equal(out["gathered"], expected)
    torch.testing.assert_close(sum(out["loss"] for out in ranks) / WORLD, loss.detach())
    assert ranks[0]["loss"] != ranks[1]["loss"]  # each rank's loss covers only its own rows


def test_single_process_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not distributed.is_dist()
    assert (distributed.rank(), distributed.world_size()) == (0, 1)
    assert distributed.init_from_env() == distributed.DistInfo(0, 0, 1, None)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert distributed.init_from_env() == distributed.DistInfo(0, 0, 1, None)
    x = torch.randn(3, 4, requires_grad=True)
    assert distributed.all_gather_with_grad(x) is x
    assert distributed.all_gather_no_grad(x) is x
    torch.testing.assert_close(distributed.all_reduce_mean(x), x.detach())
    module = nn.Linear(2, 2)
    assert distributed.wrap_ddp(module) is module
    distributed.barrier()
    distributed.cleanup()


def test_init_from_env_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="backend"):
        distributed.init_from_env("mpi")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        distributed.init_from_env()
    monkeypatch.delenv("RANK")
    with pytest.raises(RuntimeError, match="RANK"):
        distributed.init_from_env()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "abc")
    with pytest.raises(RuntimeError, match="MASTER_PORT"):
        distributed.init_from_env()
    assert not distributed.is_dist()
