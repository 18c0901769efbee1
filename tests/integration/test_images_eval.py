"""The main job from images: `warren eval` on the shipped more-itertools
tasks with the toolset and the workspace coming from OCI images pulled from
a registry.

The rootfs dirs scripts/setup.sh prepared are packed into OCI images here
(umoci): the python toolset (Debian 12 packages: python3, pytest, git,
patch) and the workspace (the more-itertools PyPI sdist as a git repo at
/w/more-itertools). They are pushed to Debian's docker-registry on loopback
(skopeo), and `warren eval --layer-image toolset/python@1=<ref>
--layer-image workspace/more-itertools@10.1.0=<ref>` pulls them and runs
the same tasks with the images' layers in those layers' places. Every
rollout's outcome must be its task's expected one, and every rollout
sandbox must stack the images' layers, not the toolset and workspace layers."""

# ruff: noqa: F811  (the fixtures imported from test_images are parameters here)
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest
import warren
from conftest import CLI, REPO
from test_images import (  # noqa: F401 - fixtures used by name
    pytestmark,
    registry,
    run,
    work,
)
from warren import eval as we

ROOTFS = Path(os.environ.get("WARREN_ROOTFS_DIR", "/var/cache/warren/rootfs"))
TOOLSET_NAME, TOOLSET_DIR = "toolset/python@1", ROOTFS / "toolset-python"
WORKSPACE_NAME, WORKSPACE_DIR = "workspace/more-itertools@10.1.0", ROOTFS / "workspace-more-itertools-10.1.0"
TASKS = REPO / "eval/tasks/more-itertools"


def oci_image(registry, work: Path, rootfs: Path, repo: str) -> str:
    """`rootfs` as a one-layer OCI image (umoci), pushed to the registry
    (skopeo) as `repo`; returns its ref."""
    if not (rootfs.parent / (rootfs.name + ".complete")).exists():
        pytest.skip(f"{rootfs} is not built (scripts/setup.sh builds it)")
    lay = work / f"oci-{rootfs.name}"
    run("umoci", "init", "--layout", str(lay))
    run("umoci", "new", "--image", f"{lay}:img")
    tar = work / f"{rootfs.name}.tar"
    with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as t:
        for top in sorted(os.listdir(rootfs)):
            t.add(rootfs / top, arcname=top)  # recursive; owners, modes, mtimes, hardlinks kept
    run("umoci", "raw", "add-layer", "--image", f"{lay}:img", str(tar), timeout=600)
    tar.unlink()
    host, _ = registry
    ref = f"{host}/{repo}"
    run("skopeo", "copy", "--dest-tls-verify=false", f"oci:{lay}:img", f"docker://{ref}", timeout=600)
    shutil.rmtree(lay)
    return ref


@pytest.fixture(scope="module")
def toolset_image(registry, work: Path) -> str:
    """The python toolset (Debian 12 packages: python3, pytest, git, patch)."""
    return oci_image(registry, work, TOOLSET_DIR, "eval/toolset-python:1")


@pytest.fixture(scope="module")
def workspace_image(registry, work: Path) -> str:
    """The workspace: the more-itertools PyPI sdist as a git repo."""
    return oci_image(registry, work, WORKSPACE_DIR, "eval/more-itertools:10.1.0")


def _pick(tasks: list, n_bugs: int) -> list:
    """The fix task and the failing task of the first n_bugs bugs."""
    stems: list = []
    for t in tasks:
        stem = t.id.rsplit("-", 1)[0]
        if stem not in stems:
            stems.append(stem)
    keep = set(stems[:n_bugs])
    return [t for t in tasks if t.id.rsplit("-", 1)[0] in keep]


class StackWatcher:
    """Records the layer stacks of the eval's sandboxes while they live."""

    def __init__(self, client: warren.Client):
        self.client = client
        self.stacks: set[tuple[str, ...]] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        deadline = time.monotonic() + 900
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                for sb in self.client.list(timeout=10):
                    info = sb.info()
                    if "warren-eval" in info.labels:
                        self.stacks.add(tuple(info.layer_names))
            except warren.WarrenError:
                pass  # a sandbox that ended between list and info
            self.stop.wait(0.2)

    def __enter__(self) -> "StackWatcher":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.mark.timeout(900)
def test_eval_runs_from_pulled_images(daemon, client, base_layer, toolset_image, workspace_image, tmp_path):
    tasks = we.load_tasks(TASKS)
    picked = _pick(tasks, 2)  # 4 tasks: 2 fixes (pass), 2 without a fix (fail)
    assert all(t.layers == (base_layer, TOOLSET_NAME, WORKSPACE_NAME) for t in picked)
    regex = "^(" + "|".join(t.id for t in picked) + ")$"
    n, c = 4, 2
    for ref in (toolset_image, workspace_image):
        with pytest.raises(warren.NotFound):
            client.images.get(ref)  # eval pulls them
    report = tmp_path / "report.json"
    env = dict(os.environ, WARREN_PYTHON=sys.executable, WARREN_ADDR=f"unix:{daemon.socket}")
    with StackWatcher(client) as w:
        p = subprocess.run([str(CLI), "eval", "--tasks", str(TASKS), "--task", regex, "-n", str(n), "-c", str(c),
                            "--report", str(report), "--no-progress",
                            "--layer-image", f"{TOOLSET_NAME}={toolset_image}",
                            "--layer-image", f"{WORKSPACE_NAME}={workspace_image}"],
                           env=env, capture_output=True, text=True, timeout=800, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"correct:     {n}/{n}" in p.stdout, p.stdout
    for ref in (toolset_image, workspace_image):
        assert f"pulled image {ref} (1 layers)" in p.stderr, p.stderr
    tool, ws = client.images.get(toolset_image), client.images.get(workspace_image)
    assert ws.source == f"registry {workspace_image}"
    want = (base_layer, tool.layers[0].layer_name, ws.layers[0].layer_name)
    assert w.stacks == {want}, w.stacks  # every rollout sandbox seen stacked the images' layers
    rep = json.loads(report.read_text())
    assert (rep["n"], rep["errors"], rep["incorrect"], rep["correct"]) == (n, 0, 0, n)
    assert {r["task"] for r in rep["rollouts"]} == {t.id for t in picked}
    for r in rep["rollouts"]:
        assert r["outcome"] == r["expected"] and r["correct"], r

    # The Python API: the same substitution, the images found this time.
    subst = we.layers_from_images(client, picked, {TOOLSET_NAME: toolset_image, WORKSPACE_NAME: workspace_image})
    assert [t.layers for t in subst] == [want] * len(picked)
    assert [t.id for t in subst] == [t.id for t in picked]
