"""Planning: the host's TF kernel rules (tf_rules), the candidates of a pass (candidates), autotuning, the planner and explain."""
