"""What the tests, benchmarks and `scripts/example` talk to instead of real services.

fake_provider.py         the loopback provider (FakeProvider): OpenAI chat completions and
                         Anthropic Messages, its requests routed, decided and answered
fake_config.py           its knobs and faults (FakeConfig) and its records (RequestRecord)
fake_faults.py           what a request meets before its answer: faults, the rate bucket, the gate
fake_answers.py          what it answers: each item's own answer, --schema answers, HOSTILE bodies
fake_anthropic.py        the Messages protocol: requests read as chat, answers in its shape
fake_http.py             the HTTP plumbing: HTTP/1.1 on asyncio in a thread, answers written
fake_batches.py          the Batch API: files and batches, each processed line by line
fake_message_batches.py  Message Batches: the same batches in Anthropic's shapes
fake_batch_faults.py     the Batch API's hostile modes (BatchFaults, LINE_FAULTS)
sentinels.py             a Redis primary, replica and three Sentinels on loopback
"""
