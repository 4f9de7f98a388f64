"""Multi-turn agentic rollouts: tool-call parsing, tools, and the agent loops (verl's
``actor_rollout_ref.rollout.multi_turn`` settings)."""
