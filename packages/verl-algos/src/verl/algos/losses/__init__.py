"""The losses of an update and what feeds them: the actor's loss (policy loss + entropy bonus + KL loss),
the critic's clipped value loss, loss aggregation over the global batch, the KL estimators and the
adaptive/fixed KL controllers. Policy losses themselves are a registry of their own
(``verl.algos.policy_losses``), as advantage estimators are (``verl.algos.advantages``)."""
