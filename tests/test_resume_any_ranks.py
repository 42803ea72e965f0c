"""Any checkpoint resumes on any number of ranks: a one-file `.pt` (one process, DDP or FSDP
rank 0) and a sharded DCP folder, resumed on 1 process, on 2 gloo ranks with DDP or FSDP2, with
the losses of an uninterrupted one-process run. Processes are real (gloo): the ranks of a torchrun
job (what `python -m quipu.flows.train_dist` runs) with the environment torchrun gives them, without
the launcher process, forked from a server that imported torch once (tests/ranks.py: no torch import
per rank; tests/test_trainer.py runs torchrun itself). The model is tiny and the runs 6 steps.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from quipu.flows.config import load_config
from quipu.trainer.checkpoint import list_checkpoints, load_checkpoint
from quipu.trainer.train import TrainConfig, train
from tests.ranks import fork_context, launch_ranks
from tests.test_trainer import base_config, losses, new_run, prepared  # noqa: F401  (prepared: the fixture)

OVER = {"train.max_steps": 6, "checkpoint.every": 3, "checkpoint.keep_last": 2, "eval.every": 100,
        "eval.sample_tokens": 0, "schedule.warmup_steps": 1}
TOL = 1e-3     # the acceptance bound per step; the runs agree far closer (reduction order only)


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory) -> list[float]:
    run = new_run(prepared, tmp_path_factory.mktemp("straight"), "straight")
    train(load_config(TrainConfig, data=base_config(run, **OVER)), run)
    out = losses(run)
    assert len(out) == 6
    return out


def one_process(run, resume=False, **over):
    return train(load_config(TrainConfig, data=base_config(run, **OVER, **over)), run, resume=resume)


def ranks(n, run, tmp_path, *args, **over):
    r = launch_ranks(n, base_config(run, **OVER, **over), tmp_path, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def assert_same_after(run, base, step=3):
    got = losses(run)
    assert len(got) == len(base)
    np.testing.assert_allclose(got[step:], base[step:], rtol=0, atol=TOL)


@pytest.mark.slow
def test_one_file_checkpoint_of_one_process_resumes_on_two_fsdp_ranks(prepared, uninterrupted, tmp_path):
    """The path every team takes: start on one machine (`quipu train`, a `.pt`), add devices (it
    failed with `KeyError: 'state.0.step'`: the optimizer state is keyed by index, FSDP2 wants names).
    DDP's one-file path is covered below."""
    run = new_run(prepared, tmp_path, "one-then-two")
    one_process(run, **{"train.stop_at_step": 3})
    assert [p.name for p in list_checkpoints(run)] == ["step-0000003.pt"]
    r = ranks(2, run, tmp_path, "--resume", **{"distributed.strategy": "fsdp"})
    assert '"world_size": 2' in r.stdout
    assert_same_after(run, uninterrupted)
    assert list_checkpoints(run)[-1].is_dir()          # continued under torchrun: sharded from then on


@pytest.mark.slow
def test_two_fsdp_ranks_resume_on_one_process_and_on_ddp(prepared, uninterrupted, tmp_path):
    """FSDP2 on 2 ranks stops after a (sharded) checkpoint; it continues on 1 process (2 -> 1) and on
    2 DDP ranks (FSDP -> DDP), both with the one-process run's losses."""
    run = new_run(prepared, tmp_path, "fsdp-2")
    ranks(2, run, tmp_path, **{"distributed.strategy": "fsdp", "train.stop_at_step": 3})
    ck = list_checkpoints(run)[-1]
    assert ck.is_dir() and sorted(p.name for p in ck.iterdir()) == ["rng-0.pt", "rng-1.pt", "state", "trainer.pt"]
    on_ddp = tmp_path / "fsdp-2-ddp"
    shutil.copytree(run, on_ddp)
    one_process(run, resume=True)
    assert_same_after(run, uninterrupted)
    ranks(2, on_ddp, tmp_path, "--resume", **{"distributed.strategy": "ddp"})
    assert_same_after(on_ddp, uninterrupted)


@pytest.mark.slow
def test_one_file_checkpoint_of_fsdp_ranks_resumes_anywhere(prepared, uninterrupted, tmp_path):
    """`checkpoint.format: single` under FSDP2 (rank 0 writes full state dicts, the optimizer's keyed
    by parameter name) resumes on 1 process and on 2 DDP ranks; DDP's sharded one on FSDP2."""
    run = new_run(prepared, tmp_path, "fsdp-single")
    ranks(2, run, tmp_path, **{"distributed.strategy": "fsdp", "train.stop_at_step": 3, "checkpoint.format": "single"})
    ck = list_checkpoints(run)[-1]
    assert ck.suffix == ".pt" and all(isinstance(k, str) for k in load_checkpoint(ck)["optimizer"]["state"])
    on_ddp = tmp_path / "fsdp-single-ddp"
    shutil.copytree(run, on_ddp)
    one_process(run, resume=True)
    assert_same_after(run, uninterrupted)
    ranks(2, on_ddp, tmp_path, "--resume", **{"distributed.strategy": "ddp", "checkpoint.format": "single"})
    assert_same_after(on_ddp, uninterrupted)

    ddp = new_run(prepared, tmp_path, "ddp-sharded")                                      # DDP -> FSDP
    ranks(2, ddp, tmp_path, **{"distributed.strategy": "ddp", "train.stop_at_step": 3})
    assert list_checkpoints(ddp)[-1].is_dir()
    ranks(2, ddp, tmp_path, "--resume", **{"distributed.strategy": "fsdp"})
    assert_same_after(ddp, uninterrupted)


def _spawned_rank(rank: int, run: str, cfg: dict, init_file: str) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        train(load_config(TrainConfig, data=cfg), run, resume=True)
        assert dist.is_initialized()            # the caller's group is the caller's to destroy
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_spawned_processes_with_their_own_group_resume_a_one_file_checkpoint(prepared, uninterrupted, tmp_path):
    """No torchrun: 2 processes spawned with their own gloo group (no RANK/WORLD_SIZE in the
    environment) take rank and world from it, resume a 1-process `.pt` under FSDP2 and save sharded."""
    import torch.multiprocessing as mp
    run = new_run(prepared, tmp_path, "spawned")
    one_process(run, **{"train.stop_at_step": 3})
    cfg = base_config(run, **OVER, **{"distributed.strategy": "fsdp"})
    fork_context()      # started from the fork server that imported torch and the trainer (tests/ranks.py)
    mp.start_processes(_spawned_rank, args=(str(run), cfg, str(tmp_path / "pg-init")), nprocs=2, join=True,
                       start_method="forkserver")
    assert_same_after(run, uninterrupted)
    ck = list_checkpoints(run)[-1]
    assert ck.is_dir() and sorted(p.name for p in ck.iterdir()) == ["rng-0.pt", "rng-1.pt", "state", "trainer.pt"]


def test_optimizer_state_converts_between_index_and_name_keys(prepared, tmp_path):
    """The unit under the cases above: a one-process optimizer state (keyed by index) re-keyed by
    parameter name and back gives the same tensors, and a state of another model is one line."""
    from quipu.trainer.checkpoint import CheckpointMismatch, optimizer_state_by_index, optimizer_state_by_name
    from quipu.trainer.llama import Llama, ModelConfig
    from quipu.trainer.train import OptimConfig, make_optimizer
    torch.manual_seed(0)
    model = Llama(ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16))
    opt = make_optimizer(model, OptimConfig(), torch.device("cpu"))
    model(torch.randint(0, 64, (2, 8)), targets=torch.randint(0, 64, (2, 8)))[0].backward()
    opt.step()
    sd = opt.state_dict()
    by_name = optimizer_state_by_name(sd, model, opt)
    assert "embed_tokens.weight" in by_name["state"] and by_name["param_groups"][0]["params"][0] == "embed_tokens.weight"
    back = optimizer_state_by_index(by_name, model, opt)
    assert back["param_groups"] == sd["param_groups"]
    assert all(torch.equal(back["state"][i][k], sd["state"][i][k]) for i in sd["state"] for k in sd["state"][i])
    other = Llama(ModelConfig(dim=32, n_layers=3, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16))
    with pytest.raises(CheckpointMismatch, match="optimizer"):
        optimizer_state_by_name(sd, other, make_optimizer(other, OptimConfig(), torch.device("cpu")))


def test_train_config_errors_name_the_key_and_what_was_expected(prepared, tmp_path):
    """What only the data, the run folder or a checkpoint can show is one line, `key: expected ...,
    got ...`, raised before any step; resuming with another model names the keys that differ."""
    from quipu.trainer.train import Trainer
    from quipu.trainer.train_config import TrainConfigError

    def error(run, resume=False, **over) -> TrainConfigError:
        with pytest.raises(TrainConfigError) as e:
            Trainer(load_config(TrainConfig, data=base_config(run, **OVER, **over)), run, resume=resume)
        assert "\n" not in str(e.value)
        return e.value

    run = new_run(prepared, tmp_path, "errors")
    e = error(run, **{"model.vocab_size": 64})
    assert e.key == "model.vocab_size" and e.got == 64 and str(e).startswith("model.vocab_size: expected a model vocabulary")
    e = error(run, **{"eval.tasks": [{"path": str(tmp_path / "nowhere.jsonl")}]})
    assert e.key == "eval.tasks[0]" and "nowhere.jsonl" in str(e)
    assert not list_checkpoints(run)                                   # nothing trained
    one_process(run, **{"train.stop_at_step": 3})
    e = error(run)
    assert e.key == "output" and "pass --resume" in str(e) and "step-0000003.pt" in str(e)
    e = error(run, resume=True, **{"model.n_layers": 3})
    assert e.key == "model" and "model.n_layers 2 (this config 3)" in str(e)
