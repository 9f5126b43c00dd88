"""The web dashboard, `hermes-bulk dashboard`: jobs, one job, workers, live, with
pause/resume/retry.

- `access`: the access token and the rules every request meets (token; same origin for actions).
- `figures`: what the pages show, read through the jobs API (never every item of a job), and
  the rates and charts sampled in this process's memory.
- `app`: the Starlette application: pages, the JSON API, the actions, the shipped static files.
- `serve`: the listening socket, the URL printed with its token, uvicorn.

Only `app` imports starlette and only `serve` imports uvicorn; the CLI loads them for this
command alone (tests/test_import_rules.py).
"""
