"""What a job is and what can be done to one, whoever asks and wherever it runs.

service.py  Jobs, the one service API: create, run, status, pause, resume, retry, list, delete
prompt.py   how one item is put to the model: the instruction, the item framed as data
model_options.py  what every request carries besides the item: temperature, -o fields, --system
export.py   the combined Markdown, CSV and JSONL exports, in input order
hints.py    next steps that work from where they are shown
"""
