"""Facts about slime's ``--advantage-estimator``: which estimators have their rewards normalised per group,
read from slime's ``RolloutManager._post_process_rewards`` (``slime/ray/rollout.py``).

Both the reward post-process hook (which reproduces slime's normalisation per rollout) and the flag checks of
a fanned-out run (which refuse slime's own normalisation there) read them from here.
"""

from __future__ import annotations

__all__ = ["CENTERED_ESTIMATORS", "STD_SCALED_ESTIMATORS"]

CENTERED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
"""``--advantage-estimator`` values whose rewards slime normalises per group (``--rewards-normalization``)."""
STD_SCALED_ESTIMATORS = ("grpo", "gspo", "cispo")
"""Those of them whose group is also divided by its std (``--grpo-std-normalization``)."""
