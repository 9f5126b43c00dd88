"""Where an item's life happens: the worker, the item pipeline, the batch driver, the breaker, metrics."""
