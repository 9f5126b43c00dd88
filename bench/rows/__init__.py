"""One module per row of issue 7's table: row<N>_<name>.py (see bench/runner.py)."""
