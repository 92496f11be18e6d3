"""Import-only stub of ``megatron.legacy`` for slime's ``train.py --debug-rollout-only`` on a CPU (the smoke's
test harness; never Megatron itself).

Why: the Megatron-LM snapshot slime pins (``../shared/megatron-lm``, commit 1dcf0daf) holds ``megatron/core`` and
``megatron/training`` only, and ``megatron.training`` imports two names of ``megatron.legacy`` at module level
(``training/initialize.py``: ``fused_kernels``; ``training/utils.py``: ``model.module.param_is_not_shared``).
slime's argument parser imports ``megatron.training.arguments`` even under ``--debug-rollout-only``, which never
builds a model, initialises Megatron or computes a gradient norm, so neither name is ever used there. This
package only satisfies the imports (``megatron`` is a namespace package, so it joins the snapshot's), and each
name raises if it is ever called: the smoke then fails loudly instead of training on a stub.

When to drop it: when the Megatron snapshot beside the repository carries ``megatron/legacy``.
"""
