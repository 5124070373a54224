import pytest

from specmac.backends import missing_requirements


def skip_unless_installed(name: str):
    """Skip (saying what to install) unless every framework the backend needs is importable."""
    missing = missing_requirements(name)
    return pytest.mark.skipif(bool(missing), reason=f"the {name} backend needs {', '.join(missing)}, "
                                                    f"not installed (pip install 'specmac[{name}]')")
