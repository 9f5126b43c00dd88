"""`scripts/example` runs its job in a data folder of its own: its jobs appeared in the user's
`/bulk list`, written into the real Hermes data folder. The real script, with the loopback
provider it starts itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _venv(tmp_path: Path) -> Path:
    """A venv as the script expects one (bin/python, bin/hermes-bulk, installed), that is this
    interpreter: the script installs nothing."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, command in (("python", ""), ("hermes-bulk", " -m hermes_bulk")):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}"{command} "$@"\n')
        script.chmod(0o755)
    (tmp_path / "venv" / ".hermes-bulk-installed").touch()
    return tmp_path / "venv"


def test_the_example_keeps_its_jobs_out_of_the_users_data_folder(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HERMES_BULK_", "OPENAI_", "ANTHROPIC_")) and k != "HERMES_HOME"
    }
    own = tmp_path / "example-data"
    env |= {
        "HOME": str(home),
        "VENV": str(_venv(tmp_path)),
        "HERMES_BULK_EXAMPLE_HOME": str(own),
        # a backend the user set for their own jobs is not the example's either
        "HERMES_BULK_BACKEND": f"sqlite:///{tmp_path / 'users.db'}",
    }
    proc = subprocess.run(
        [str(ROOT / "scripts" / "example")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"(data: {own})" in proc.stdout, proc.stdout
    assert (own / "bulk.db").is_file()
    assert not (home / ".hermes").exists(), "nothing in the user's Hermes data folder"
    assert not (tmp_path / "users.db").exists(), "nor in the backend the user named"
