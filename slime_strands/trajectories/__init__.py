"""The trajectory file (one JSON line per episode, written by ``slime-strands eval``) and its
token-by-token view, read by ``inspect`` and ``drift``.
"""
