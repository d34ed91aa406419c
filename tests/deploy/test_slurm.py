"""deploy/slurm: the systemd units checked by the real `systemd-analyze verify` (skipped locally
when it is missing, a failure under CI), their commands parsed by the command lines they run,
and the example environment files read as the programs would read them."""

from __future__ import annotations

import configparser
import shlex
import subprocess

import pytest

from agent.cli import parse_config
from server.cli.main import _parser as laggard_parser
from tests.deploy.tools import REPO, VENV_BIN, require_tool

SLURM = REPO / "deploy" / "slurm"
UNITS = ("laggard-agent.service", "laggard-slurm-sync.service", "laggard-slurm-sync.timer")
INSTALL_BIN = "/opt/laggard/bin/"  # where the units expect the venv (docs/deploying.md)


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string((SLURM / name).read_text())
    return parser


def env_file(name: str) -> dict[str, str]:
    pairs = {}
    for line in (SLURM / name).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{name}: {line!r} is not KEY=VALUE"
            pairs[key.strip()] = value.strip()
    return pairs


def exec_start(name: str, env: dict[str, str]) -> list[str]:
    """ExecStart as systemd splits it, ${VAR} replaced by the variable as one word."""
    words = shlex.split(unit(name)["Service"]["ExecStart"])
    return [env.get(w[2:-1], "") if w.startswith("${") and w.endswith("}") else w for w in words]


def test_systemd_analyze_verify_accepts_the_units(tmp_path):
    systemd_analyze = require_tool("systemd-analyze", "part of systemd")
    for name in UNITS:
        # verify checks that ExecStart's program exists: point it at this environment's.
        text = (SLURM / name).read_text().replace(INSTALL_BIN, f"{VENV_BIN}/")
        (tmp_path / name).write_text(text)
    proc = subprocess.run([systemd_analyze, "verify", *(str(tmp_path / n) for n in UNITS)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 0 and not complaints, "\n".join(complaints)


def test_systemd_analyze_verify_notices_a_bad_key(tmp_path):
    systemd_analyze = require_tool("systemd-analyze", "part of systemd")
    text = (SLURM / "laggard-agent.service").read_text().replace(INSTALL_BIN, f"{VENV_BIN}/")
    (tmp_path / "laggard-agent.service").write_text(text.replace("Restart=always", "Restart=always\nRestartt=always"))
    proc = subprocess.run([systemd_analyze, "verify", str(tmp_path / "laggard-agent.service")], capture_output=True, text=True, timeout=60)
    assert "Restartt" in proc.stderr


def test_agent_unit_restarts_and_keeps_nvml_and_sys_readable():
    service = unit("laggard-agent.service")["Service"]
    assert service["Restart"] == "always"
    assert service["EnvironmentFile"] == "/etc/laggard/agent.env"
    assert service["ExecStart"].startswith(INSTALL_BIN)
    assert service.get("PrivateDevices", "no") == "no"  # NVML opens /dev/nvidia*
    assert "DevicePolicy" not in service and "MemoryDenyWriteExecute" not in service
    # /sys must stay visible: read-only protections only, never InaccessiblePaths=/sys.
    assert "/sys" not in service.get("InaccessiblePaths", "")
    assert service["ProtectSystem"] == "strict" and service["NoNewPrivileges"] == "yes"


def test_agent_unit_command_and_env_file_parse():
    env = env_file("agent.env.example")
    cfg = parse_config(exec_start("laggard-agent.service", env)[1:], env=env)
    assert cfg.collector == env["LAGGARD_COLLECTOR_URL"] and cfg.cluster == env["LAGGARD_CLUSTER"]
    assert "EXAMPLE" in env["LAGGARD_TOKEN"]
    # Attribution names Slurm jobs with scontrol: the unprivileged unit cannot read other users' environ.
    assert (cfg.attribution, cfg.scontrol) == ("auto", "/usr/bin/scontrol")
    assert unit("laggard-agent.service")["Service"]["DynamicUser"] == "yes"


def test_slurm_sync_unit_runs_the_real_command_from_its_timer():
    env = env_file("slurm-sync.env.example")
    argv = exec_start("laggard-slurm-sync.service", env)
    assert argv[0] == INSTALL_BIN + "laggard"
    args = laggard_parser().parse_args(argv[1:])
    assert (args.command, args.apply, args.cluster, args.interval) == ("slurm-sync", True, env["LAGGARD_CLUSTER"], None)
    service = unit("laggard-slurm-sync.service")["Service"]
    assert service["Type"] == "oneshot" and service["EnvironmentFile"] == "/etc/laggard/slurm-sync.env"
    assert "LAGGARD_SERVER" in env and "LAGGARD_TOKEN" in env  # read by `laggard slurm-sync` (server/collector_client.py)
    timer = unit("laggard-slurm-sync.timer")
    assert timer["Timer"]["OnUnitInactiveSec"] and timer["Install"]["WantedBy"] == "timers.target"


@pytest.mark.parametrize("name", ["laggard-agent.service", "laggard-slurm-sync.timer"])
def test_units_can_be_enabled(name):
    assert unit(name)["Install"]["WantedBy"]
