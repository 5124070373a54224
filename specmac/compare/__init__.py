"""Measure configurations side by side (``measure``, ``settings``), write records with provenance
(``results``) and render them (``report``)."""
