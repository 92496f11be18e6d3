"""Chat templates and token ids: rendering a conversation incrementally (never re-rendering a turn),
what a template does (the probe: how a turn ends, which tool parser), and exact token codecs.

Below the provider: no HTTP, no agent, no settings.
"""
