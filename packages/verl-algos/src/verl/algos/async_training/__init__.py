"""Training that overlaps generation (``async_training.mode``): the one-step-off-policy schedule
(``one_step_off``) and the fully asynchronous one with partial rollouts (``fully_async``), both with the
rollout on a pool of its own."""
