"""The kodeagent API reference, checked name by name: every member it documents on `Agent`,
`ReActAgent` and `CodeActAgent` exists (at `kodeagent.kodeagent`, the path it documents), the
history methods say what they do before a run, and CodeAct takes the reference's option names as
aliases of `sandboxes`' names. (The history methods during and after a run, driven by a model:
`tests/test_agent_seed_methods.py`.)"""

from __future__ import annotations

from typing import Any

import pytest

from kodeagent import ConfigurationError, NoRunError
from kodeagent.kodeagent import Agent, CodeActAgent, ReActAgent

# The members the reference lists under each class, as it lists them.
AGENT_NAMES = """
HISTORY_TRUNCATE_CHARS add_output_file add_to_history artifacts chat_history clear_history current_plan
current_trace description filter_tools_for_task final_answer_found get_history get_system_prompt_content
get_tools_description get_usage_metrics get_usage_report id init_history is_visual_model litellm_params
max_iterations max_retries model_name msg_idx_of_new_task name normalize_content observer
parse_text_response persona planner post_run pre_run purpose response response_format_class run
salvage_response system_prompt task task_output_files tool_name_to_func tool_names tools tracer_manager
tracing_type usage_tracker work_dir
""".split()
CODEACT_NAMES = """
allowed_imports env_vars_to_set get_system_prompt_content init_history parse_text_response pip_packages
response_format_class run_env system_prompt timeout
""".split()
REACT_NAMES = (
    "init_history parse_text_response post_run pre_run response_format_class run system_prompt".split()
)


def test_the_reference_lists_what_it_lists() -> None:
    assert len(AGENT_NAMES) == len(set(AGENT_NAMES)) == 47


@pytest.mark.parametrize(
    ("cls", "names"),
    [(ReActAgent, AGENT_NAMES + REACT_NAMES), (CodeActAgent, AGENT_NAMES + CODEACT_NAMES)],
    ids=["ReActAgent", "CodeActAgent"],
)
def test_every_documented_name_exists(cls: type[Agent], names: list[str]) -> None:
    agent = cls("openai/x")
    names = sorted(set(names))
    missing = [name for name in names if not hasattr(agent, name)]
    assert not missing, f"{cls.__name__} lacks the documented {missing}"
    undocumented = [
        name for name in names if callable(getattr(cls, name, None)) and not getattr(cls, name).__doc__
    ]
    assert not undocumented, f"{cls.__name__} documents nothing for {undocumented}"


def test_before_a_run_the_views_are_empty_and_adding_is_refused() -> None:
    agent = ReActAgent("openai/x")
    assert agent.task is None and agent.chat_history == [] and agent.artifacts == []
    assert agent.task_output_files == [] and agent.current_trace is None and agent.msg_idx_of_new_task == 0
    with pytest.raises(NoRunError, match=r"add_to_history\(\).*has not run yet"):
        agent.add_to_history({"role": "user", "content": "lost"})
    with pytest.raises(NoRunError, match=r"add_output_file\(\)"):
        agent.add_output_file("/tmp/out.txt")
    agent.init_history()  # nothing to start over: the first run builds its conversation
    agent.clear_history()
    assert agent.last_run is None and agent.chat_history == []


# ---------------------------------------------------------------------- CodeAct: sandboxes' names, the reference's aliases


def test_codeact_takes_sandboxes_names() -> None:
    agent = CodeActAgent(
        "openai/x", backend="e2b", env={"A": "1"}, pip_packages=["pandas>=2", "numpy"], timeout=2.5
    )
    assert (agent.backend, agent.env, agent.pip_packages, agent.timeout) == (
        "e2b",
        {"A": "1"},
        ["pandas>=2", "numpy"],
        2.5,
    )
    assert agent.run_env == "e2b" and agent.env_vars_to_set == {"A": "1"}  # read by either name


def test_codeact_takes_the_reference_names_as_aliases() -> None:
    agent = CodeActAgent(
        "openai/x", run_env="e2b", env_vars_to_set={"A": "1"}, pip_packages="pandas>=2, numpy  six", timeout=7
    )
    assert agent.backend == "e2b" and agent.env == {"A": "1"}
    assert agent.pip_packages == ["pandas>=2", "numpy", "six"] and agent.timeout == 7.0


def test_codeact_defaults() -> None:
    agent = CodeActAgent("openai/x")
    assert (agent.backend, agent.env, agent.pip_packages, agent.timeout) == ("host", {}, None, 30.0)
    assert agent.allowed_imports is None and agent.executor_options == {}


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"backend": "host", "run_env": "docker"}, ("'backend'", "'run_env'")),
        ({"env": {}, "env_vars_to_set": {"A": "1"}}, ("'env'", "'env_vars_to_set'")),
    ],
)
def test_an_alias_with_its_name_is_an_error_naming_both(
    options: dict[str, Any], names: tuple[str, str]
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        CodeActAgent("openai/x", **options)
    assert all(name in str(refused.value) for name in names)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"backend": "moon"}, "backend: input should be 'host', 'docker', 'e2b' or 'ray', got 'moon'"),
        ({"run_env": "moon"}, "run_env: input should be"),  # named as the caller named it
        ({"timeout": -1}, "timeout: input should be greater than 0, got -1"),
        ({"env": {"A": 1}}, "env"),
        ({"backend": "docker", "pip_packages": ["six"]}, "E2B sandbox"),
    ],
)
def test_codeact_option_errors_name_the_option(options: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigurationError, match=said.replace("(", r"\(").replace(")", r"\)")):
        CodeActAgent("openai/x", **options)


# ---------------------------------------------------------------------- the common options: one declaration


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"max_iterations": 0}, "max_iterations: input should be greater than or equal to 1, got 0"),
        ({"max_retries": -1}, "max_retries: input should be greater than or equal to 0, got -1"),
        ({"planning_interval": 0}, "planning_interval"),
        ({"tool_calling": "yaml"}, "tool_calling: input should be 'auto', 'native', 'json' or 'text'"),
        ({"structured_output": "yaml"}, "structured_output"),
        ({"observer": "watchful"}, "observer: input should be an instance of Observer"),
        ({"tools": [len, len]}, r"two tools share the name\(s\) \['len'\]"),
    ],
)
def test_a_value_that_cannot_work_names_the_option(options: dict[str, Any], said: str) -> None:
    for cls in (ReActAgent, CodeActAgent):
        with pytest.raises(ConfigurationError, match=said):
            cls("openai/x", **options)


def test_defaults_come_from_the_declaration() -> None:
    agent = ReActAgent("openai/x")
    assert (agent.max_iterations, agent.max_retries, agent.tools, agent.litellm_params) == (20, 3, [], {})
    assert (agent.tool_calling, agent.structured_output, agent.stream, agent.planner) == (
        "auto",
        "auto",
        False,
        None,
    )
    assert ReActAgent("openai/x", planning_interval=2).planner is not None
