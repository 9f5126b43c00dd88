"""The only code that speaks to a model provider, and the checks on what it says.

client.py     the model-client protocol, the OpenAI-compatible HTTP client, error classes
bodies.py     the request for one item in each protocol (the send and create --dry-run)
batch_api.py  the provider's Batch API over HTTP; every batch object and line checked
answers.py    what an answer must be before it is kept (the body's shape, `--schema`)
pacing.py     waiting policy over the shared limiter: 429 pauses, RPM/TPM pacing
doctor.py     can this endpoint, key and model serve a job?
(Hermes' own client, `ctx.llm`, is adapted in plugin/hermes.py: only plugin/ imports Hermes.)
"""
