"""Is the output still the target's? The harness behind ``specmac verify``: two-sample chi-square
per position (``harness``, ``chisquare``) and the diagnosis of greedy mismatches (``greedy``)."""
