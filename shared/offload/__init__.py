"""The torch-free parts of the 10Cache offload engine: the planner (which tensors stay,
which stream, in what order) and the prefetch / eviction rules. The engine in
`offload_agent/`, the profiler service and the simulator's cost model all stand on
these, so they live on the ground floor."""
