"""The slime-train tier (marker ``slime_train``): slime's own ``train.py --debug-rollout-only`` ran the plugin on a
CPU against the real SGLang server (``scripts/slime_cpu_smoke.sh``); these tests check what it saved. See
conftest.py."""
