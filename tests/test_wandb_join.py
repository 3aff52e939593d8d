"""Join decisions, settings and environment cleaning (``sidecar.exporters.wandb.join``).

Pure functions, plus a check that real ``wandb.Settings`` accepts and means what we pass."""

from __future__ import annotations

import pytest

from sidecar.exporters.wandb import join
from sidecar.exporters.wandb.join import PlanKind, TrainerRun

HOST = "box1"


def test_shared_join_settings_are_exactly_the_secondary_writer() -> None:
    assert join.shared_join_settings(HOST) == {
        "mode": "shared",
        "x_primary": False,
        "x_update_finish_state": False,
        "x_label": "box1/sidecar",
        "x_disable_stats": True,
        "x_disable_meta": True,
        "x_disable_machine_info": True,
        "x_save_requirements": False,
        "console": "off",
        "save_code": False,
        "disable_code": True,
        "disable_git": True,
        "silent": True,
    }


def test_offline_settings_are_an_ordinary_own_run() -> None:
    settings = join.offline_run_settings(HOST)
    assert settings["mode"] == "offline"
    assert "x_primary" not in settings and "x_update_finish_state" not in settings
    assert settings["x_label"] == "box1/sidecar" and settings["console"] == "off"


def test_real_wandb_settings_accept_and_mean_the_join_fields() -> None:
    wandb = pytest.importorskip("wandb")
    shared = wandb.Settings(**join.shared_join_settings(HOST))
    assert shared.mode == "shared" and shared._shared
    assert shared.x_primary is False and shared.x_update_finish_state is False
    assert shared.x_label == "box1/sidecar" and shared.x_disable_stats is True
    offline = wandb.Settings(**join.offline_run_settings(HOST))
    assert offline.mode == "offline" and offline.x_primary is True
    assert offline.x_update_finish_state is True


def test_init_kwargs_join_by_id_without_resume() -> None:
    plan = join.Plan(PlanKind.SHARED, run_id="r1", project="p", entity="e")
    kwargs = join.init_kwargs(plan, HOST, "/tmp/x")
    assert kwargs == {"id": "r1", "project": "p", "entity": "e", "reinit": "create_new",
                      "dir": "/tmp/x"}
    assert "resume" not in kwargs  # resume="allow" writes at the trainer's offsets


def test_init_kwargs_offline_own_run_grouped_with_trainer_run() -> None:
    plan = join.Plan(PlanKind.OFFLINE, run_id="r1", project="p", entity=None)
    kwargs = join.init_kwargs(plan, HOST, None)
    assert "id" not in kwargs  # a fresh run id of its own
    assert kwargs["group"] == "r1" and kwargs["job_type"] == "sidecar"
    assert kwargs["name"] == "sidecar box1" and kwargs["project"] == "p"
    with pytest.raises(ValueError):
        join.init_kwargs(join.Plan(PlanKind.WAIT), HOST, None)


def test_clean_environ_drops_run_scoped_and_keeps_connection_variables() -> None:
    env = {
        "WANDB_SERVICE": "2-123-unix-/tmp/sock", "WANDB_RUN_ID": "r1", "WANDB_RESUME": "allow",
        "WANDB_X_PRIMARY": "true", "WANDB_MODE": "shared", "WANDB_RUN_GROUP": "g",
        "WANDB_CONFIG_PATHS": "c.yaml", "WANDB_TAGS": "a,b", "WANDB_NAME": "n",
        "WANDB_X_LABEL": "rank0", "WANDB__SERVICE_WAIT": "5", "WANDB_SERVICE_TRANSPORT": "tcp",
        "WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": "https://w.example", "WANDB_PROJECT": "p",
        "WANDB_ENTITY": "e", "WANDB_DIR": "/var/lib/x", "WANDB_SILENT": "true",
        "PATH": "/usr/bin", "HOME": "/root",
    }
    kept, removed = join.clean_environ(env)
    assert removed == sorted([
        "WANDB_SERVICE", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_X_PRIMARY", "WANDB_MODE",
        "WANDB_RUN_GROUP", "WANDB_CONFIG_PATHS", "WANDB_TAGS", "WANDB_NAME", "WANDB_X_LABEL",
        "WANDB__SERVICE_WAIT", "WANDB_SERVICE_TRANSPORT"])
    assert kept == {k: env[k] for k in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT",
                                         "WANDB_ENTITY", "WANDB_DIR", "WANDB_SILENT", "PATH",
                                         "HOME")}


@pytest.mark.parametrize(("env", "force", "expected"), [
    ({}, False, "online"),
    ({"WANDB_MODE": "shared"}, False, "online"),
    ({"WANDB_MODE": "offline"}, False, "offline"),
    ({"WANDB_MODE": "dryrun"}, False, "offline"),
    ({}, True, "offline"),
    ({"WANDB_MODE": "disabled"}, True, "disabled"),
])
def test_daemon_mode(env: dict[str, str], force: bool, expected: str) -> None:
    assert join.daemon_mode(env, force) == expected


def test_refuses_a_trainer_run_that_is_not_shared_and_names_the_fix() -> None:
    plan = join.decide("r1", TrainerRun("r1", mode="online", primary=True), mode="online")
    assert plan.kind is PlanKind.REFUSE and plan.run_id == "r1"
    assert "WANDB_MODE=shared" in plan.reason and "WANDB_X_PRIMARY=true" in plan.reason
    assert "'online'" in plan.reason


def test_joins_a_shared_trainer_run_with_announced_project_first() -> None:
    plan = join.decide("auto", TrainerRun("r1", "tp", "te", "shared", True), mode="online",
                       project="cfg-p", entity="cfg-e")
    assert (plan.kind, plan.run_id, plan.project, plan.entity) == (
        PlanKind.SHARED, "r1", "tp", "te")
    plan = join.decide("r1", TrainerRun("r1", None, None, "shared", None), mode="online",
                       project="cfg-p", entity="cfg-e")
    assert (plan.project, plan.entity) == ("cfg-p", "cfg-e")


def test_own_offline_run_takes_the_trainers_project_then_the_settings_then_the_default() -> None:
    trainer = TrainerRun("r1", "tp", None, "offline", True)
    assert join.decide("auto", trainer, mode="online", project="cfg-p").project == "tp"
    assert join.decide("r1", None, mode="offline", project="cfg-p").project == "cfg-p"
    for plan in (join.decide("r1", None, mode="offline"),
                 join.decide("auto", TrainerRun("r1", None, None, "offline", True), mode="online")):
        assert (plan.kind, plan.project) == (PlanKind.OFFLINE, join.OFFLINE_PROJECT)
    shared = join.decide("r1", TrainerRun("r1", None, None, "shared", True), mode="online")
    assert shared.project is None  # joining the trainer's run: never a made-up project


def test_waits_until_the_trainer_states_its_mode() -> None:
    assert join.decide("auto", None, mode="online").kind is PlanKind.WAIT
    plan = join.decide("r1", None, mode="online")
    assert plan.kind is PlanKind.WAIT and "WANDB_MODE=shared" in plan.reason
    assert join.decide("r1", TrainerRun("r1"), mode="online").kind is PlanKind.WAIT
    # a hello about another run says nothing about the requested one
    other = TrainerRun("r2", mode="shared")
    assert join.decide("r1", other, mode="online").kind is PlanKind.WAIT


def test_offline_daemon_logs_to_its_own_run_whatever_the_trainer_mode() -> None:
    for trainer in (None, TrainerRun("r1", mode="online"), TrainerRun("r1", mode="shared")):
        plan = join.decide("r1", trainer, mode="offline")
        assert plan.kind is PlanKind.OFFLINE and plan.run_id == "r1"
        assert "wandb sync" in plan.reason
    assert join.decide("auto", None, mode="offline").kind is PlanKind.WAIT


def test_offline_trainer_gets_a_grouped_own_run_and_disabled_ones_nothing() -> None:
    assert join.decide("r1", TrainerRun("r1", mode="offline"), mode="online").kind \
        is PlanKind.OFFLINE
    assert join.decide("r1", TrainerRun("r1", mode="disabled"), mode="online").kind \
        is PlanKind.REFUSE
    assert join.decide(None, TrainerRun("r1", mode="shared"), mode="online").kind \
        is PlanKind.DISABLED
    assert join.decide("r1", None, mode="disabled").kind is PlanKind.DISABLED


def test_prefixed_rows() -> None:
    row, skipped = join.prefixed({"gpu/0/utilization": 0.93, "sidecar/x": 1, "s": "str",
                                  "n": None, "o": object()}, 42)
    assert row == {"sidecar/gpu/0/utilization": 0.93, "sidecar/x": 1.0,
                   "sidecar/trainer_step": 42}
    assert skipped == 3
    assert join.prefixed({"a": 1}, None) == ({"sidecar/a": 1.0}, 0)


def test_credential_source_never_needs_the_key(tmp_path: pytest.TempPathFactory) -> None:
    assert join.credential_source({"WANDB_API_KEY": "x" * 40}) == "WANDB_API_KEY"
    netrc = tmp_path / "netrc"  # type: ignore[operator]
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "a" * 40 + "\n")
    netrc.chmod(0o600)
    assert join.credential_source({"NETRC": str(netrc)}) == "netrc"
    assert join.credential_source({"NETRC": str(netrc),
                                   "WANDB_BASE_URL": "https://other.example"}) is None
    assert join.credential_source({}, home=str(tmp_path)) is None


def test_redact() -> None:
    key = "0123456789abcdef" * 2 + "01234567"
    env = {"WANDB_API_KEY": "secret-key-value"}
    assert join.redact(f"auth failed for secret-key-value and {key}", env) == \
        "auth failed for *** and ***"
