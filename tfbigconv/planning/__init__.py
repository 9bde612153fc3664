"""Planning: the host's TF kernel rules (tf_rules), a pass's Plan (plan), the candidates of a pass (candidates), timing them (timing) and autotuning, the planner and explain."""
