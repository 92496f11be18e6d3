"""Import-only stub of ``megatron.rl`` (see ``megatron/legacy/__init__.py`` of this stub for why and when to drop
it): ``megatron/training/training.py`` imports ``megatron.rl.parallel_utils.build_inference_pg_collection`` at
module level (and ``megatron.rl.rl_utils`` in a ``try``, which stays absent here)."""
