"""Images, continued: merging an image's layers offline into one verified
EROFS layer (compared file by file with `umoci unpack`), the mapping of
task images onto the three layer kinds (shared lower layers -> one base,
the task's top -> its workspace, toolsets on top of any image), and the
layer GC (`images.prune`, `warren image prune`)."""

# ruff: noqa: F811  (the fixtures imported from test_images are parameters here)
from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest
import warren
from conftest import CLI
from test_images import (  # noqa: F401 - fixtures used by name
    _add_tar_layer,
    _ti,
    assert_same_tree,
    layer_names,
    layout,
    pushed,
    pytestmark,
    reference,
    registry,
    run,
    sandbox_tree,
    store_tmp,
    tree,
    work,
)


def test_merge_matches_umoci(client, pushed, reference, layer_store):
    """t1 has 3 layers (whiteouts of a file and a dir, an opaque dir, a
    hardlink, an xattr, setuid bits): merged below its top, and all of them,
    a sandbox shows exactly the umoci-unpacked image."""
    img = client.images.pull(pushed["t1"], timeout=300)
    assert img.merged is None and img.stack == img.layers
    events: list[warren.ImageProgress] = []
    m = client.images.merge(img.name, progress=events.append, timeout=300)
    assert m.merged_count == 2 and m.merged is not None
    chain = m.merged.layer_name
    assert (
        chain.startswith("base/oci-chain@")
        and m.merged.digest == "chain:sha256:" + chain.split("@")[1]
    )
    assert [x.layer_name for x in m.stack] == [chain, img.layers[2].layer_name]
    assert [e.phase for e in events] == ["merging", "done"]
    assert client.images.get(img.name) == m
    want = tree(reference)
    with client.create(image=img.name) as sb:
        assert list(sb.info().layer_names) == [chain, img.layers[2].layer_name]
        assert (
            sb.exec("cat /d/sub/f /d/hard; pwd", timeout=30).stdout
            == b"second\nsecond\n/work\n"
        )
        assert_same_tree(sandbox_tree(sb), want)
        assert (
            client.images.get(img.name).in_use == 1
        )  # counted through the merged layer too
        with pytest.raises(warren.FailedPrecondition):
            client.images.remove(img.name)

    # Every layer, the top one too (a separate image record of the same layers).
    full = client.images.pull(pushed["t1"], name="merge/full:1", timeout=300)
    full = client.images.merge(full.name, include_top=True, timeout=300)
    assert (
        full.merged_count == 3
        and len(full.stack) == 1
        and full.merged.layer_name != chain
    )
    with client.create(image=full.name) as sb:
        assert list(sb.info().layer_names) == [full.merged.layer_name]
        assert_same_tree(sandbox_tree(sb), want)
    # A cap below the layers' size refuses and builds nothing.
    before = layer_names(client)
    other = client.images.pull(pushed["t2"], name="merge/capped:1", timeout=300)
    with pytest.raises(warren.FailedPrecondition) as ei:
        client.images.merge(other.name, max_bytes=4096)
    assert "merge cap" in ei.value.details
    assert layer_names(client) == sorted(
        set(before) | {x.layer_name for x in other.layers}
    )
    client.images.remove(full.name)
    client.images.remove(other.name)
    assert full.merged.layer_name not in layer_names(client)
    assert chain in layer_names(client)  # t1's record still lists it
    assert store_tmp(layer_store) == []


@pytest.fixture(scope="module")
def task_images(client, layout: Path, work: Path) -> list[warren.Image]:
    """A task set: two task images over t1's layers (the shared lower
    layers), each with its own top layer (its repository)."""
    out = []
    for task in ("task-a", "task-b"):
        run("umoci", "tag", "--image", f"{layout}:t1", task)
        _add_tar_layer(
            layout,
            task,
            [
                _ti("repo/", tarfile.DIRTYPE, 0o755),
                _ti("repo/TASK", data=task.encode() + b"\n"),
            ],
            work,
        )
        out.append(
            client.images.import_(
                str(layout), ref_name=task, name=f"tasks/{task}:1", timeout=300
            )
        )
    return out


def test_task_images_share_one_merged_base(client, task_images, layer_store):
    a, b = task_images
    before = set(layer_names(client))
    ma = client.images.merge(a.name, timeout=300)
    mb = client.images.merge(b.name, timeout=300)
    # base: t1's 3 layers merged once, shared; workspace: each task's own top.
    assert (
        ma.merged.layer_name == mb.merged.layer_name
        and ma.merged_count == mb.merged_count == 3
    )
    assert set(layer_names(client)) - before <= {ma.merged.layer_name}
    assert (
        ma.stack[1].layer_name != mb.stack[1].layer_name
        and len(ma.stack) == len(mb.stack) == 2
    )
    for img, task in ((ma, "task-a"), (mb, "task-b")):
        with client.create(image=img.name) as sb:
            assert (
                sb.exec("cat /repo/TASK /opq/c", timeout=30).stdout
                == task.encode() + b"\nc\n"
            )


def test_toolset_stacks_on_any_imported_image(
    client, task_images, pushed, layout, work
):
    """A toolset layer on top of: a merged task image (base + workspace +
    toolset), a pulled image, an OCI layout and a docker archive import."""
    tool = work / "tool-kinds"
    (tool / "opt/tool").mkdir(parents=True, exist_ok=True)
    (tool / "opt/tool/run").write_text("tool\n")
    try:
        client.layers.get("toolset/kinds@1")
    except warren.NotFound:
        client.layers.build("toolset/kinds@1", dir=str(tool))
    merged = client.images.merge(task_images[0].name, timeout=300)
    archive = work / "kinds-docker.tar"
    run(
        "skopeo",
        "copy",
        f"oci:{layout}:t2",
        f"docker-archive:{archive}:kinds/archive:v1",
    )
    images = [
        merged,
        client.images.pull(pushed["t2"], timeout=300),
        client.images.import_(
            str(layout), ref_name="t1", name="kinds/layout:t1", timeout=300
        ),
        client.images.import_(str(archive), timeout=300),
    ]
    for img in images:
        with client.create(image=img.name, layers=["toolset/kinds@1"]) as sb:
            names = list(sb.info().layer_names)
            assert names == [x.layer_name for x in img.stack] + ["toolset/kinds@1"], (
                img.name
            )
            r = sb.exec("cat /opt/tool/run /d/sub/f; ls /opq", timeout=30)
            assert r.stdout == b"tool\nsecond\nc\n", (img.name, r)
    assert merged.stack[0].layer_name.startswith("base/oci-chain@")


def test_replaced_image_layers_are_pruned_never_one_in_use(
    client, work, layer_store, base_layer
):
    """Re-pulling a name over another image orphans its layers: prune
    reclaims them, but not while a sandbox still uses them."""
    from test_images import make_layout, tar_bytes

    first = make_layout(
        work / "gc-1",
        [
            tar_bytes([_ti("gc1", data=b"1" * 3000)]),
            tar_bytes([_ti("gc2", data=b"2" * 3000)]),
        ],
    )
    second = make_layout(work / "gc-2", [tar_bytes([_ti("gc3", data=b"3" * 3000)])])
    client.images.prune()  # whatever earlier tests left
    one = client.images.import_(str(first), name="gc/img:1", timeout=120)
    # A sandbox on the first image's layers (via a raw layer list: the image
    # record is about to be replaced).
    sb = client.create(layers=[base_layer] + [x.layer_name for x in one.layers])
    try:
        client.images.import_(
            str(second), name="gc/img:1", timeout=120
        )  # replaces the record
        assert client.images.prune().removed == ()  # in use by the sandbox
        assert {x.layer_name for x in one.layers} <= set(layer_names(client))
    finally:
        sb.destroy()
    r = client.images.prune()
    assert sorted(r.removed) == sorted(x.layer_name for x in one.layers)
    assert r.bytes_freed == sum(x.size_bytes for x in one.layers)
    assert not {x.layer_name for x in one.layers} & set(layer_names(client))
    client.images.remove("gc/img:1")
    assert store_tmp(layer_store) == []


def test_cli_merge_inspect_prune(daemon, client, layout):
    addr = "unix:" + str(daemon.socket)

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run(
            [str(CLI), "--addr", addr, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert not check or p.returncode == 0, (
            f"warren {args} -> {p.returncode}: {p.stderr}"
        )
        return p

    cli(
        "image",
        "import",
        str(layout),
        "--ref-name",
        "t2",
        "--name",
        "cli/merge:1",
        "-q",
    )
    p = cli("image", "merge", "cli/merge:1")
    assert p.stdout.split()[0] == "cli/merge:1"
    assert any(line.endswith(" merging") for line in p.stderr.splitlines()), p.stderr
    info = json.loads(cli("image", "inspect", "cli/merge:1").stdout)
    assert info["merged_count"] == 3 and info["merged"]["layer_name"].startswith(
        "base/oci-chain@"
    )
    assert info["stack"] == [
        info["merged"]["layer_name"],
        info["layers"][3]["layer_name"],
    ]
    p = cli("image", "merge", "cli/merge:1", "--all", "--max-bytes", "1", check=False)
    assert (
        p.returncode == 1
        and "FAILED_PRECONDITION" in p.stderr
        and "merge cap" in p.stderr
    )
    cli("image", "rm", "cli/merge:1")
    out = json.loads(cli("--json", "image", "prune").stdout)
    assert set(out) == {"removed", "bytes_freed"}
