"""E2B API keys are warren tokens: on a cluster node (a real etcd,
test_cluster.py's Etcd and Node) with --e2b-listen, a project's token used
as E2B_API_KEY creates sandboxes of that project under its quota (the same
admission as warren.v1's Create) and sees and touches only that project's
sandboxes; the node's token acts for every project; any other key is a 401.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from test_cluster import ETCD, REFRESH_MS, Etcd, Node, free_port, wait_until
from test_e2b import _ensure_e2b

pytestmark = pytest.mark.skipif(not os.path.exists(ETCD), reason="etcd-server is not installed (scripts/setup.sh)")

NODE_TOKEN = "e2b-projects-node-token"


@pytest.fixture(scope="module")
def node(test_root: Path, layer_store, base_layer) -> Iterable[Node]:
    _ensure_e2b()
    token_file = test_root / "e2b-projects.token"
    token_file.write_text(NODE_TOKEN + "\n")
    token_file.chmod(0o600)
    etcd = Etcd(test_root, "etcd-e2b").start()
    port = free_port()
    n = Node(test_root, "e2bp", layer_store, etcd, token_file,
             extra=["--e2b-listen", f"127.0.0.1:{port}", "--fncall-layers", base_layer])
    n.e2b_url = f"http://127.0.0.1:{port}"
    try:
        n.start()
        wait_until(lambda: n.node_id in etcd.nodes(), 15, "the node registered")
        time.sleep(2 * REFRESH_MS / 1000)
        yield n
    finally:
        n.stop()
        etcd.stop()


@pytest.fixture()
def e2b(node: Node, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("E2B_API_URL", node.e2b_url)
    monkeypatch.setenv("E2B_SANDBOX_URL", node.e2b_url)
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    import e2b

    return e2b


def test_project_keys_are_scoped_and_held_to_their_quota(node: Node, e2b) -> None:
    admin = node.client
    _, a_tok = admin.create_project("e2b-a", sandboxes=1)
    _, b_tok = admin.create_project("e2b-b")
    made = []
    try:
        a = e2b.Sandbox.create(api_key=a_tok, timeout=120, metadata={"who": "a"})
        made.append(a.sandbox_id)
        assert admin.get(a.sandbox_id).info().labels["warren.project"] == "e2b-a"
        assert a.commands.run("echo in-a").stdout == "in-a\n"
        # The project's quota (1 sandbox) holds on this surface too.
        with pytest.raises(e2b.RateLimitException) as ei:
            made.append(e2b.Sandbox.create(api_key=a_tok, timeout=120).sandbox_id)
        assert "e2b-a" in str(ei.value) and "quota" in str(ei.value), str(ei.value)
        assert len([s for s in admin.list() if s.info().labels.get("warren.project") == "e2b-a"]) == 1
        # Another project's key: neither listed nor reachable, the same
        # answer as for an id that does not exist.
        b = e2b.Sandbox.create(api_key=b_tok, timeout=120)
        made.append(b.sandbox_id)
        listed_b = {s.sandbox_id for s in e2b.Sandbox.list(api_key=b_tok).next_items()}
        assert listed_b == {b.sandbox_id}
        assert {s.sandbox_id for s in e2b.Sandbox.list(api_key=a_tok).next_items()} == {a.sandbox_id}
        for ghost in (a.sandbox_id, a.sandbox_id[:-4] + "0000"):
            assert e2b.Sandbox.kill(ghost, api_key=b_tok) is False
            with pytest.raises(e2b.SandboxNotFoundException):
                e2b.Sandbox.get_info(ghost, api_key=b_tok)
            with pytest.raises(e2b.NotFoundException):
                e2b.Sandbox.connect(ghost, api_key=b_tok)
            with pytest.raises(e2b.NotFoundException):
                e2b.Sandbox.set_timeout(ghost, 60, api_key=b_tok)
        assert admin.get(a.sandbox_id).info().state == "running"  # untouched
        # The node's token acts for every project.
        every = {s.sandbox_id for s in e2b.Sandbox.list(api_key=NODE_TOKEN).next_items()}
        assert {a.sandbox_id, b.sandbox_id} <= every
        # A key that is nobody's.
        with pytest.raises(e2b.AuthenticationException):
            e2b.Sandbox.list(api_key="wp_not_a_token").next_items()
        # Once a's sandbox is gone, its quota admits a new one (usage is
        # recomputed from the table within a refresh).
        assert e2b.Sandbox.kill(a.sandbox_id, api_key=a_tok) is True
        made.remove(a.sandbox_id)

        def create_again():
            try:
                return e2b.Sandbox.create(api_key=a_tok, timeout=120)
            except e2b.RateLimitException:
                return None

        again = wait_until(create_again, 10, "a create within the released quota", step=REFRESH_MS / 1000)
        made.append(again.sandbox_id)
    finally:
        for sid in made:
            e2b.Sandbox.kill(sid, api_key=NODE_TOKEN)
        for p in ("e2b-a", "e2b-b"):
            admin.delete_project(p)
