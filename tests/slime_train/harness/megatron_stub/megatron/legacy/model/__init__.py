"""Import-only stub (see ``megatron/legacy/__init__.py`` of this stub)."""
