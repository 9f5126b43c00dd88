"""The cron budget: one request ledger, shared by every Hermes profile and machine, that holds
background work (cron jobs, bulk jobs) before it spends the requests kept for chat.

windows.py (pure)  the daily window that opens at `reset` in an IANA zone, across DST
policy.py  (pure)  which calls count and what one admission decides
settings.py        budget.json: defaults, validation, where things live
ledger.py          the RequestLedger protocol and its records
ledger_location.py open_ledger(location): a location (config/backend_url.py) to a ledger
sqlite_ledger.py   one SQLite file (one BEGIN IMMEDIATE per admission; turns.py queues writers)
redis_ledger.py    Redis (one Lua script per admission, lua/admit_request.lua)
failopen.py        the note `status` shows when accounting failed and calls went through
service.py         Budget: admit (never raises) and report, over all of the above
gate.py            BudgetGate: the bulk pipeline's RequestGate; gate_from_environment()
report.py          the status block; commands.py: `status` / `set` for every front end
"""
