"""Hermes Agent plugins shipped with hermes-bulk: thin glue from Hermes onto the same service API."""
