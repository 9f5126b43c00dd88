"""What users type and read: `hermes-bulk`, the dashboard, and what `/bulk` shares with them.

cli.py         `hermes-bulk`: one handler per command
waiting.py     a terminal waiting on a job: progress, and workers here until it ends (--wait)
parser.py      the parser `hermes-bulk` and `/bulk` share, built from grammar.py's table
grammar.py     every command and its options, declared once as data (options.py: how)
values.py      the range of every number the command line takes, and the types that check it
replies.py     what each command answers, once for both front ends
views/         what users read: the status block, job and worker tables, progress
terminal.py    lines, tables and bars on a terminal
logs.py        where logs go, redacted
flag_files.py  the small files a flag names (`--schema`, `--instruction-file`)
dashboard/     the web dashboard
(plugin/ is the Hermes front end: it adapts Hermes onto the same replies.)
"""
