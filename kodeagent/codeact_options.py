"""`CodeActAgent`'s options: the common `AgentOptions` and where and how its code runs, in `sandboxes`' words.

The names are those of `sandboxes.open_executor` (`backend`, `env`, `pip_packages` as a list, a float
`timeout`). The API reference's names stay as documented aliases (`CODEACT_ALIASES`): ``run_env`` for
`backend` and ``env_vars_to_set`` for `env`; ``pip_packages`` also takes the reference's one string
(``"pandas>=2, numpy"``) and ``timeout`` an int. Giving an alias and its name together is an error
naming both. Imported when a `CodeActAgent` is made (it reads `sandboxes`' list of backends), not by
``import kodeagent``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final

from pydantic import AfterValidator, ConfigDict, Field, with_config

from sandboxes.backends import BackendName

from .errors import ConfigurationError
from .options import AgentOptions, check_options

__all__ = ["CODEACT_ALIASES", "CodeActOptions", "check_codeact_options", "split_packages"]

CODEACT_ALIASES: Final[Mapping[str, str]] = {"run_env": "backend", "env_vars_to_set": "env"}
"""The API reference's option names -> the names they stand for."""


def split_packages(spec: str) -> list[str]:
    """``"pandas>=2, numpy matplotlib"`` -> ``["pandas>=2", "numpy", "matplotlib"]`` (the reference's form)."""
    return [part for part in re.split(r"[\s,]+", spec) if part]


def _packages(packages: str | Sequence[str] | None) -> list[str] | None:
    if packages is None:
        return None
    return split_packages(packages) if isinstance(packages, str) else list(packages)


def _copy_list(values: Sequence[str] | None) -> list[str] | None:
    return list(values) if values is not None else None


def _copy_env(env: Mapping[str, str] | None) -> dict[str, str]:
    return dict(env or {})


def _copy_options(options: dict[str, Any] | None) -> dict[str, Any]:
    return dict(options or {})


@with_config(ConfigDict(arbitrary_types_allowed=True, validate_default=True))
class CodeActOptions(AgentOptions, total=False):
    """The options of `CodeActAgent`: the common `AgentOptions`, and these.

    backend: where the code runs: ``"host"`` (default), ``"docker"``, ``"e2b"`` or ``"ray"`` (a Ray
        cluster's node). Alias: ``run_env``.
    allowed_imports: modules the code may import (``"pkg.*"`` for a package and its submodules);
        None means the sandbox's default pure-computation set.
    pip_packages: extra packages installed in the sandbox (E2B only): a list, or one string of
        names separated by spaces or commas.
    timeout: wall-clock seconds each code run may take (more than 0). Default 30.
    env: the environment the code sees (nothing else of the host's leaks in). Alias: ``env_vars_to_set``.
    executor_options: further options for `sandboxes.open_executor` (e.g. ``policy``).
    run_env, env_vars_to_set: the API reference's names of `backend` and `env`.
    """

    backend: Annotated[BackendName, Field(default="host")]
    allowed_imports: Annotated[Sequence[str] | None, Field(default=None), AfterValidator(_copy_list)]
    pip_packages: Annotated[str | Sequence[str] | None, Field(default=None), AfterValidator(_packages)]
    timeout: Annotated[float, Field(default=30.0, gt=0)]
    env: Annotated[Mapping[str, str] | None, Field(default=None), AfterValidator(_copy_env)]
    executor_options: Annotated[dict[str, Any] | None, Field(default=None), AfterValidator(_copy_options)]
    run_env: BackendName
    env_vars_to_set: Mapping[str, str] | None


def check_codeact_options(owner: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` checked against `CodeActOptions` (aliases resolved), then the checks across options."""
    checked = check_options(owner, options, CodeActOptions, aliases=CODEACT_ALIASES)
    if checked["pip_packages"] and checked["backend"] != "e2b":
        raise ConfigurationError(
            "pip_packages can only be installed in an E2B sandbox (backend='e2b'); for host and docker, "
            "install packages in the environment or image and list them in allowed_imports"
        )
    return checked
