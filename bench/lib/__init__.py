"""Helpers of the bench/ scripts (not entry points): where the real models are, the machine-wide
benchmark lock, the peers' decoders, the anatomy's report. The scripts run as ``python
bench/X.py``, so bench/ is first on sys.path and ``from lib.models import ...`` finds this package.
"""
