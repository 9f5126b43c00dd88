"""Hermes Agent plugins: thin glue from Hermes' plugin API onto hermes-bulk's own services.

Each plugin is a module exposing register(ctx), named by an entry point in the
`hermes_agent.plugins` group. Hermes is imported only inside functions of this package (a
plugin must import in a bare interpreter), and nothing outside this package imports Hermes.
"""
