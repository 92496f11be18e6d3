"""The Strands model provider over SGLang: the HTTP client, ``SGLangModel``, the token trajectory it
records (``TokenManager``), SGLang's sampling keys and the tool-call policy of a turn.

Usable alone as a library (``from slime_strands import SGLangModel``); knows nothing of slime or episodes.
"""
