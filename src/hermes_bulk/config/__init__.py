"""Configuration: what hermes-bulk reads from the environment, `.env` and Hermes' settings.

fields.py       every setting once: name, kind, default, bounds, environment names
settings.py     Settings (pydantic-settings) built from fields.py, and load_settings()
quick.py        the same table read without pydantic, for the read commands that must start fast
backend_url.py  what a store or ledger URL names (`sqlite:///…`, `redis[s]://…`)
"""
