"""The planner's cost model: profiles (loading, choosing, writing), calibrate (this CPU), gpu_fit (the GPU section)."""
