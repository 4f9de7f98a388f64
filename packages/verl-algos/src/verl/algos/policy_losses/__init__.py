"""Policy losses, selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``.

Importing this package registers: vanilla (PPO clip, clip-higher, dual-clip), gspo, gpg, clip_cov,
kl_cov, cispo, sapo, geo_mean (GMPO) and bypass_mode (rollout correction). See :mod:`.registry` for the
signature and the metrics each reports.
"""

from verl.algos.policy_losses import bypass, cispo, cov, gmpo, gspo, ppo, sapo  # noqa: F401  (register the losses)
from verl.algos.policy_losses.registry import POLICY_LOSSES, get_policy_loss, register_policy_loss

__all__ = ["POLICY_LOSSES", "get_policy_loss", "register_policy_loss"]
