"""Tuning: what a run measures about this machine before it starts, between the API and the core.

``calibration`` times the target's pass per width and each draft model's pass and prefill, keeps
them per machine and model, and checks what it kept against fresh passes and against the run;
``timing`` is the clock discipline it shares with the probes; ``thread_curves`` derives a curve at
one thread count from the one kept at another; ``machine`` says how busy the machine is. The core's
planner gets plain numbers (``specmac.core.costs.Costs``); files, clocks and /proc stay here.
"""
