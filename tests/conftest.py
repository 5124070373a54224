import importlib.util

import pytest

from specmac.backends import missing_requirements

REAL_BACKENDS = ("mlx", "gguf", "torch")


def installed(name: str) -> bool:
    return not missing_requirements(name)


def skip_unless_installed(name: str):
    missing = missing_requirements(name)
    return pytest.mark.skipif(bool(missing), reason=f"the {name} backend needs {', '.join(missing)}, "
                                                    f"not installed (pip install 'specmac[{name}]')")


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
