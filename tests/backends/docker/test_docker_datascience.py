"""The datascience image: numpy, pandas, matplotlib, and figures coming back as PNG artifacts."""

from __future__ import annotations

import pytest
from support import backend_docker

from sandboxes import Limits, Policy

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

IMAGE = "kodeagent-sandbox:datascience"
POLICY = Policy(
    allowed_imports=("numpy", "numpy.*", "pandas", "pandas.*", "matplotlib", "matplotlib.*"),
    limits=Limits(memory_mb=1024),
)


@pytest.fixture(autouse=True)
def _datascience_image() -> None:
    backend_docker.require()
    backend_docker.require(IMAGE, "datascience")


async def test_numpy_and_pandas():
    async with backend_docker.make_executor(image=IMAGE, policy=POLICY, timeout=60) as ex:
        result = await ex.run("import numpy as np; print(np.arange(3).sum())")
        assert result.stdout == "3\n", result
        result = await ex.run("import pandas as pd\nprint(pd.DataFrame({'a': [1, 2, 3]})['a'].mean())")
        assert result.stdout == "2.0\n", result


async def test_shown_and_saved_figures_come_back_as_png_artifacts():
    async with backend_docker.make_executor(image=IMAGE, policy=POLICY, timeout=60) as ex:
        result = await ex.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
        assert result.error is None, result
        assert [a.path for a in result.artifacts] == ["figure_1.png"]
        result = await ex.run("plt.figure(); plt.bar([1, 2], [3, 4]); plt.savefig('bars.png'); plt.show()")
        assert sorted(a.path for a in result.artifacts) == ["bars.png", "figure_2.png"]
        assert (await ex.run("plt.show()")).artifacts == []  # shown figures are closed, not saved twice
        for name in ("figure_1.png", "figure_2.png", "bars.png"):
            assert (await ex.download(name)).startswith(b"\x89PNG\r\n\x1a\n")


async def test_numpy_pandas_and_pil_values_cross_as_themselves():
    """The values contract's numpy/pandas/PIL round trips, on the image that has them (the `py` image
    the conformance suite uses does not)."""
    from conformance.test_values import NUMPY_PANDAS_PIL_POLICY, check_numpy_pandas_pil_cross, keeper

    got: list = []
    async with backend_docker.make_executor(
        image=IMAGE, policy=NUMPY_PANDAS_PIL_POLICY, timeout=60, tools={"keep": keeper(got)}
    ) as ex:
        await check_numpy_pandas_pil_cross(ex, got)
