import pytest


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory):
    """The suite keeps converted models and pass costs in a folder of its own: a kept cost measured
    by an earlier run on a busy machine must not steer this run's `--k auto` tests."""
    mp = pytest.MonkeyPatch()
    mp.setenv("SPECMAC_CACHE", str(tmp_path_factory.mktemp("specmac-cache")))
    yield
    mp.undo()
