"""The real-SGLang tier (marker ``real_sglang``): tests against SGLang 0.5.23 itself; see conftest.py."""
