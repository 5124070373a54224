"""The core: pure numpy. Sampling, the rejection rule, the loop, the draft sources, the step planner
and its cost model, run stats. No files, no environment, one clock (the loop's step timer)."""
