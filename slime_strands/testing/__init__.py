"""Test utilities that are useful to users too: a local SGLang-protocol server (no GPU needed)."""

from .server import Fault, RecordedRequest, SGLangTestServer, SGLangTestServerError, Turn

__all__ = ["Fault", "RecordedRequest", "SGLangTestServer", "SGLangTestServerError", "Turn"]
