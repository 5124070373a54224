import pytest

from specmac.backends import missing_requirements


def skip_unless_installed(name: str):
    """Skip (saying what to install) unless every framework the backend needs is importable."""
    missing = missing_requirements(name)
    return pytest.mark.skipif(bool(missing), reason=f"the {name} backend needs {', '.join(missing)}, "
                                                    f"not installed (pip install 'specmac[{name}]')")


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory):
    """The suite keeps converted models and pass costs in a folder of its own: a kept cost measured
    by an earlier run on a busy machine must not steer this run's `--k auto` tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECMAC_CACHE", str(tmp_path_factory.mktemp("specmac-cache")))
    yield
    mp.undo()
