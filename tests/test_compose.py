"""The compose stack as a user runs it, without a Docker engine: the files
say what the stack needs, and docker/init.sh (what the `init` service runs as root) is run here
with sh on real folders."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
IMAGE_UID = 10001


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def example_env() -> dict[str, str]:
    lines = (DOCKER / ".env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def fleet_page() -> str:
    return (ROOT / "docs" / "fleet.md").read_text()


def test_the_image_runs_as_uid_10001_and_ships_the_init_script():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert re.search(rf"useradd .*--uid {IMAGE_UID} bulk", dockerfile)
    assert re.search(r"^USER bulk$", dockerfile, re.M)
    assert re.search(r"^COPY docker/init\.sh /usr/local/bin/hermes-bulk-init$", dockerfile, re.M)


def test_the_cli_keeps_its_data_directory_in_a_named_volume():
    stack = compose()
    cli = stack["services"]["cli"]
    assert cli["environment"]["HERMES_BULK_HOME"] == "/data/bulk"
    mounts = {m.split(":")[1]: m.split(":")[0] for m in cli["volumes"]}
    assert mounts["/data/bulk"] in stack["volumes"], (
        "a named volume, not the container's own disk (gone with --rm)"
    )
    assert mounts["/data/out"] == "./out"


def test_an_init_service_runs_first_as_root_and_everything_waits_for_it():
    services = compose()["services"]
    init = services["init"]
    assert init["user"] == "root" and init["image"] == services["cli"]["image"]
    assert init["entrypoint"] == ["sh", "/usr/local/bin/hermes-bulk-init"]
    assert init["restart"] == "no"
    assert set(init["volumes"]) >= {
        "./out:/data/out",
        next(v for v in services["cli"]["volumes"] if ":/data/bulk" in v),
    }
    assert "${REDIS_PASSWORD:?" in init["environment"]["REDIS_PASSWORD"]
    for name in ("redis", "worker", "cli", "dashboard"):
        assert services[name]["depends_on"]["init"] == {
            "condition": "service_completed_successfully"
        }, name
    assert "user" not in services["worker"] and "user" not in services["cli"], (
        "they run as the image's uid"
    )


def test_the_fleet_page_says_compose_v2_and_the_env_copy_step():
    section = fleet_page()
    assert "cp docker/.env.example docker/.env" in section
    assert "Docker Compose v2" in section and "docker compose -f docker/compose.yaml up" in section
    assert "docker-compose` 1.x, Debian's 1.29, rejects the file" in section
    assert not re.search(r"^docker-compose ", section, re.M), "no command for the 1.x tool"
    header = (DOCKER / "compose.yaml").read_text().split("\nname:", 1)[0]
    assert "Compose v2" in header and "cp docker/.env.example docker/.env" in header


def test_the_dashboard_is_a_service_that_needs_its_token_and_publishes_on_loopback_only():
    from hermes_bulk.frontends.parser import build_parser

    services = compose()["services"]
    dashboard = services["dashboard"]
    assert dashboard["image"] == services["worker"]["image"] and "user" not in dashboard
    args = build_parser().parse_args(dashboard["command"][1:])
    assert dashboard["command"][0] == "hermes-bulk" and (args.command, args.host) == (
        "dashboard",
        "0.0.0.0",
    )
    assert dashboard["ports"] == [f"127.0.0.1:{args.port}:{args.port}"], (
        "never on every address of the machine"
    )
    assert (
        "${HERMES_BULK_DASHBOARD_TOKEN:?" in dashboard["environment"]["HERMES_BULK_DASHBOARD_TOKEN"]
    )
    assert (
        dashboard["environment"]["HERMES_BULK_BACKEND"]
        == services["worker"]["environment"]["HERMES_BULK_BACKEND"]
    )
    assert dashboard["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert dashboard["depends_on"]["init"] == {"condition": "service_completed_successfully"}
    assert (
        "HERMES_BULK_DASHBOARD_TOKEN" in example_env()
        and example_env()["HERMES_BULK_DASHBOARD_TOKEN"] == ""
    ), "no example token anyone could copy"


def test_init_refuses_the_example_password_as_the_env_example_spells_it():
    script = (DOCKER / "init.sh").read_text()
    example = example_env()["REDIS_PASSWORD"]
    assert f'EXAMPLE_PASSWORD="{example}"' in script


# docker/init.sh, run ------------------------------------------------------------------------

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"),
    reason="init.sh chowns (root) and checks access with setpriv",
)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A folder uid 10001 can reach (pytest's tmp_path sits under a root-only folder), as /data
    is."""
    path = Path(tempfile.mkdtemp(prefix="hermes-bulk-init-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def run_init(
    tmp_path: Path, password: str | None, *, out: Path | None = None
) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "OUT_DIR": str(out or tmp_path / "out"),
        "BULK_DIR": str(tmp_path / "bulk"),
    }
    if password is not None:
        env["REDIS_PASSWORD"] = password
    return subprocess.run(
        ["sh", str(DOCKER / "init.sh")], env=env, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("password", [None, "", example_env()["REDIS_PASSWORD"]])
def test_init_stops_the_stack_on_the_example_or_an_empty_password(tmp_path, password):
    proc = run_init(tmp_path, password)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(
        "hermes-bulk init: REDIS_PASSWORD in docker/.env is empty or still the example's;"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "bulk").exists(), (
        "nothing done before the check"
    )


@needs_root
def test_init_gives_a_root_owned_out_folder_to_uid_10001(open_dir):
    tmp_path = open_dir
    out = tmp_path / "out"
    out.mkdir(mode=0o755)  # as the Docker daemon makes a missing bind-mount folder
    proc = run_init(tmp_path, "a-long-random-password-1f3a")
    assert proc.returncode == 0, proc.stderr
    assert out.stat().st_uid == IMAGE_UID
    writable = subprocess.run(
        [
            "setpriv",
            f"--reuid={IMAGE_UID}",
            f"--regid={IMAGE_UID}",
            "--clear-groups",
            "touch",
            str(out / "results.csv"),
        ],
        capture_output=True,
        text=True,
    )
    assert writable.returncode == 0, writable.stderr
    bulk = (tmp_path / "bulk").stat()
    assert bulk.st_uid == IMAGE_UID and stat.S_IMODE(bulk.st_mode) == 0o700


@needs_root
def test_init_leaves_a_folder_the_user_made_and_refuses_it_when_10001_cannot_write(open_dir):
    tmp_path = open_dir
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    os.chown(mine, 1000, 1000)
    proc = run_init(tmp_path, "a-long-random-password-1f3a", out=mine)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"hermes-bulk init: docker/out (mounted at {mine}) is owned by uid 1000 and uid "
        f"{IMAGE_UID} cannot write to it; run: sudo chown {IMAGE_UID} docker/out"
    )
    assert mine.stat().st_uid == 1000, "not taken from its owner"
    mine.chmod(0o777)
    assert run_init(tmp_path, "a-long-random-password-1f3a", out=mine).returncode == 0
    assert mine.stat().st_uid == 1000


def sentinel_stack() -> dict:
    return yaml.safe_load((DOCKER / "compose.sentinel.yaml").read_text())


def test_the_sentinel_variant_points_every_bulk_service_at_its_three_sentinels():
    from hermes_bulk.config.backend_url import parse_backend_url
    from hermes_bulk.store.redis.failover import FAILOVER_WAIT_S

    stack = sentinel_stack()
    services = stack["services"]
    sentinels = sorted(name for name in services if name.startswith("sentinel-"))
    assert sentinels == ["sentinel-1", "sentinel-2", "sentinel-3"]
    script = services["sentinel-1"]["entrypoint"][2]
    assert all(services[name]["entrypoint"][2] == script for name in sentinels)
    monitor = re.search(r"^sentinel monitor (\S+) redis 6379 (\d+)$", script, re.M)
    service, quorum = monitor.group(1), int(monitor.group(2))
    assert quorum == 2, "a majority of three"
    down_after_ms = int(re.search(rf"down-after-milliseconds {service} (\d+)", script).group(1))
    assert down_after_ms / 1000 + 5 < FAILOVER_WAIT_S, "a failover ends before commands give up"
    assert "sentinel auth-pass" in script and "resolve-hostnames yes" in script
    for name in ("worker", "dashboard", "cli"):
        url = parse_backend_url(
            services[name]["environment"]["HERMES_BULK_BACKEND"].replace("${REDIS_PASSWORD}", "pw")
        )
        assert url.service == service
        assert url.sentinels == tuple((s, 26379) for s in sentinels)
        assert set(services[name]["depends_on"]) == set(sentinels)
    replica = services["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 :][:2] == ["redis", "6379"]
    assert "--masterauth" in replica and "--masterauth" in services["redis"]["command"]
    assert set(stack["services"]) - set(compose()["services"]) == {"redis-replica", *sentinels}


def test_the_sentinel_variant_says_to_name_both_files():
    head = (DOCKER / "compose.sentinel.yaml").read_text().split("\n\n", 1)[0]
    assert "docker compose -f docker/compose.yaml -f docker/compose.sentinel.yaml up" in head
