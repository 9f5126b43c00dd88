"""The only code that speaks to a model provider: the HTTP client, the Batch API, what an answer must be, pacing."""
