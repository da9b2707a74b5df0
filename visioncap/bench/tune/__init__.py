"""`visioncap tune`: measure candidate chunked-prefill budgets under the mixed workload and keep the best."""
