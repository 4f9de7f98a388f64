"""Which resource pool each worker role runs in: verl's placement keys, checked before Ray starts.

By default every role shares one pool, ``global_pool``: ``trainer.n_gpus_per_node`` processes on each of
``trainer.nnodes`` nodes, each process hosting the actor, the rollout, the reference and, when the run has
them, the critic and the reward model (the hybrid engine). A role can instead get a pool of its own:

- the reward model with verl's ``reward_model.enable_resource_pool``, ``reward_model.n_gpus_per_node``
  and ``reward_model.nnodes``;
- the critic with ``critic.enable_resource_pool``, ``critic.n_gpus_per_node`` and ``critic.nnodes``
  (verl's trainer always puts its critic in the global pool; these keys are ours, shaped like the reward
  model's);
- the rollout with verl's ``actor_rollout_ref.hybrid_engine=false`` and the top-level ``rollout.nnodes``
  and ``rollout.n_gpus_per_node``: the global pool then hosts the actor and the reference ("actor_ref"),
  and the rollout workers receive the actor's weights after each update (``workers.weight_sync``).

A role on its own pool has its own processes and its own data-parallel size; the trainer sends it the
same batches either way.
"""

from __future__ import annotations

from dataclasses import dataclass

from verl.algos.advantages.registry import uses_critic
from verl.algos.config.schema import PPOConfig
from verl.core.config import ConfigError

GLOBAL_POOL = "global_pool"
ROLLOUT_POOL = "rollout_pool"
#: role -> (its config section, its own pool's name)
OWN_POOLS = {"critic": ("critic", "critic_pool"), "rm": ("reward_model", "reward_pool")}


@dataclass(frozen=True)
class Placement:
    #: pool name -> worker processes on each of its nodes
    pools: dict[str, list[int]]
    #: role ("actor_rollout_ref", "rollout", "critic", "rm") -> the pool it runs in
    roles: dict[str, str]

    @property
    def processes(self) -> int:
        return sum(sum(nodes) for nodes in self.pools.values())

    def world(self, role: str) -> int:
        """The worker processes of ``role`` (of its pool)."""
        return sum(self.pools[self.roles.get(role, GLOBAL_POOL)])

    def roles_in(self, pool: str) -> list[str]:
        return [role for role, where in self.roles.items() if where == pool]


def plan_placement(cfg: PPOConfig) -> Placement:
    """The run's pools and its roles' places; a ConfigError for an impossible mapping."""
    trainer = cfg.trainer
    pools = {GLOBAL_POOL: [trainer.n_gpus_per_node] * trainer.nnodes}
    roles = {"actor_rollout_ref": GLOBAL_POOL}
    if not cfg.actor_rollout_ref.hybrid_engine:
        pools[ROLLOUT_POOL] = [cfg.rollout.n_gpus_per_node] * cfg.rollout.nnodes
        roles["rollout"] = ROLLOUT_POOL
    in_use = {"critic": uses_critic(cfg.algorithm.adv_estimator), "rm": cfg.reward_model.enable}
    for role, (key, pool) in OWN_POOLS.items():
        section = getattr(cfg, key)
        if not in_use[role]:
            if section.enable_resource_pool:
                why = (
                    f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} uses no critic"
                    if role == "critic"
                    else "reward_model.enable=false"
                )
                raise ConfigError(
                    f"{key}.enable_resource_pool=true, but this run has no {key.replace('_', ' ')} ({why}); "
                    f"drop {key}.enable_resource_pool, or enable the role"
                )
            continue
        if not section.enable_resource_pool:
            roles[role] = GLOBAL_POOL
            continue
        for count in ("n_gpus_per_node", "nnodes"):
            if getattr(section, count) <= 0:
                raise ConfigError(
                    f"{key}.enable_resource_pool=true needs {key}.{count} > 0 (the {key.replace('_', ' ')}'s own "
                    f"pool has {key}.n_gpus_per_node processes on each of {key}.nnodes nodes), got "
                    f"{getattr(section, count)}"
                )
        pools[pool] = [section.n_gpus_per_node] * section.nnodes
        roles[role] = pool
    return Placement(pools, roles)


def world_key(placement: Placement, role: str) -> str:
    """How a message names the processes of ``role``."""
    pool = placement.roles.get(role, GLOBAL_POOL)
    if pool == GLOBAL_POOL:
        return "trainer.nnodes x trainer.n_gpus_per_node"
    if pool == ROLLOUT_POOL:
        return "rollout.nnodes x rollout.n_gpus_per_node"
    key = OWN_POOLS[role][0]
    return f"{key}.nnodes x {key}.n_gpus_per_node"
