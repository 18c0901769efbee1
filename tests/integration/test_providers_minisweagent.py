"""mini-swe-agent's Environment on warren, driven by the real harness: its
DefaultAgent with its DeterministicModel (a scripted trajectory) runs on
warren.integrations.minisweagent.WarrenEnvironment to the submit line."""

import pytest

from harness_venv import install_pin

PIN = "mini-swe-agent==2.4.6"


@pytest.fixture(scope="module")
def msa():
    install_pin(PIN, "minisweagent")
    import minisweagent

    return minisweagent


@pytest.fixture()
def env(msa, daemon, base_layer):
    from warren.integrations.minisweagent import WarrenEnvironment

    e = WarrenEnvironment(layers=[base_layer], cwd="/root", timeout=10, env={"GREETING": "hi"},
                          addr="unix:" + str(daemon.socket), create={"labels": {"test": "1"}})
    yield e
    e.cleanup()


def test_execute_contract(env):
    # The harness's Protocol (not runtime-checkable): its members, same signature.
    import inspect

    from minisweagent import Environment
    from minisweagent.exceptions import Submitted
    for name in ("execute", "get_template_vars", "serialize", "config"):
        assert hasattr(env, name), name
    assert list(inspect.signature(env.execute).parameters)[:2] == \
        list(inspect.signature(Environment.execute).parameters)[1:3] == ["action", "cwd"]
    out = env.execute({"command": "echo out; echo err >&2; echo $GREETING; exit 3"})
    assert out == {"output": "out\nerr\nhi\n", "returncode": 3, "exception_info": ""}
    # cwd argument, and the login shell's HOME.
    env.execute({"command": "mkdir -p /tmp/x"})
    assert env.execute({"command": "pwd; echo $HOME"}, cwd="/tmp/x")["output"] == "/tmp/x\n/root\n"
    t = env.execute({"command": "echo started; sleep 30"}, timeout=1)
    assert t["returncode"] == -1 and "timed out" in t["exception_info"] and t["output"] == "started\n"
    with pytest.raises(Submitted) as e:
        env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo the patch"})
    assert e.value.messages[0]["extra"] == {"exit_status": "Submitted", "submission": "the patch\n"}
    assert env.serialize()["info"]["config"]["environment_type"] == \
        "warren.integrations.minisweagent.WarrenEnvironment"
    assert env.get_template_vars()["cwd"] == "/root"


def test_scripted_trajectory_to_submit(env, client, tmp_path):
    import yaml
    from minisweagent.agents.default import AgentConfig, DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.environments import get_environment
    from minisweagent.models.test_models import DeterministicModel, make_output

    steps = [
        "printf 'def add(a, b):\\n    return a - b\\n' > calc.py && cat calc.py",
        "sed -i 's/a - b/a + b/' calc.py && python3 -c 'import calc; print(calc.add(2, 3))'",
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat calc.py",
    ]
    outputs = [make_output(f"step {i}\n```mswea_bash_command\n{c}\n```", [{"command": c}])
               for i, c in enumerate(steps)]
    cfg = yaml.safe_load((builtin_config_dir / "default.yaml").read_text())
    agent_cfg = {k: v for k, v in cfg["agent"].items() if k in AgentConfig.model_fields}
    agent_cfg["output_path"] = tmp_path / "traj.json"
    agent = DefaultAgent(DeterministicModel(outputs=outputs), env, **agent_cfg)
    result = agent.run("fix calc.add")
    assert result == {"exit_status": "Submitted", "submission": "def add(a, b):\n    return a + b\n"}
    observations = [m["content"] for m in agent.messages if m["role"] == "user"][1:]
    assert "<returncode>0</returncode>" in observations[1] and "5" in observations[1]
    assert (tmp_path / "traj.json").exists()

    # And built from a config the way `mini` does it (environment_class path).
    e2 = get_environment({"environment_class": "warren.integrations.minisweagent.WarrenEnvironment",
                          "layers": env.config.layers, "addr": env.config.addr})
    try:
        assert e2.execute({"command": "echo ok"})["output"] == "ok\n"
    finally:
        sid = e2.sandbox.id
        e2.cleanup()
        import warren
        with pytest.raises(warren.NotFound):
            client.get(sid)
