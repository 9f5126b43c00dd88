"""What a job is and what can be done to one, whoever asks and wherever it runs.

service.py  Jobs, the one service API: create, run, status, pause, resume, retry, list, delete
request.py  JobRequest: what a job is asked to be, validated in one place
creating.py  create and its dry-run Plan: the items, their estimates and worst cases
life.py     run, pause, resume, retry, delete: a job's transitions
status.py   a job's status, its derived state and the records status, list and show read
prompt.py   how one item is put to the model: the instruction, the item framed as data
model_options.py  what every request carries besides the item: temperature, -o fields, --system
templates.py  what of a CSV row or JSON record is sent: --template, --fields
export.py   the combined Markdown, CSV and JSONL exports, in input order
hints.py    next steps that work from where they are shown
"""
