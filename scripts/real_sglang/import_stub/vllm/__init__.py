"""NOT vLLM: an import-only stand-in on the SGLang server's PYTHONPATH (see ``_custom_ops``)."""
