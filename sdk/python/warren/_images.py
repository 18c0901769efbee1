"""Images (``client.images``): OCI/Docker images pulled from a registry or
imported from an OCI layout / ``docker save`` archive, made of layers of the
node's layer store (api/warren/v1/image.proto). One implementation for the
sync and the async client (see warren._core)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from . import errors
from ._core import END, Callback, Gen, Next, Open, Rpc, op
from ._proto import image_pb2 as ipb
from ._proto import image_pb2_grpc as ipb_grpc

if TYPE_CHECKING:
    from ._client_core import ClientCore


@dataclass(frozen=True)
class ImageConfig:
    """The image config's defaults: env ("KEY=VALUE"), workdir and user are
    applied by create(image=...); entrypoint, cmd, exposed_ports are kept."""

    env: Tuple[str, ...]
    workdir: str
    user: str
    entrypoint: Tuple[str, ...]
    cmd: Tuple[str, ...]
    exposed_ports: Tuple[str, ...]


@dataclass(frozen=True)
class ImageLayer:
    """digest: the OCI layer digest; layer: the EROFS layer's digest and
    layer_name its name ("base/oci-sha256@<hex>"); size_bytes of the EROFS
    image."""

    digest: str
    layer: str
    layer_name: str
    size_bytes: int


@dataclass(frozen=True)
class Image:
    """An image of the node: name "name:tag", digest of its manifest, layers
    bottom first, config, created_at_ns, source (ref or path), in_use
    (sandboxes using one of its layers). merged (after images.merge()): one
    layer equal to layers[:merged_count] stacked; `stack` is what a create
    from the image stacks."""

    name: str
    digest: str
    layers: Tuple[ImageLayer, ...]
    config: ImageConfig
    created_at_ns: int
    source: str
    in_use: int
    merged: Optional[ImageLayer] = None
    merged_count: int = 0

    @property
    def stack(self) -> Tuple[ImageLayer, ...]:
        """The layers a create from this image stacks, bottom first."""
        if self.merged is None:
            return self.layers
        return (self.merged, *self.layers[self.merged_count:])

    @classmethod
    def _from_pb(cls, m: ipb.Image) -> Image:
        c = m.config
        merged = None
        if m.merged_count:
            x = m.merged
            merged = ImageLayer(x.digest, x.layer, x.layer_name, x.size_bytes)
        return cls(m.name, m.digest,
                   tuple(ImageLayer(x.digest, x.layer, x.layer_name, x.size_bytes) for x in m.layers),
                   ImageConfig(tuple(c.env), c.workdir, c.user, tuple(c.entrypoint), tuple(c.cmd),
                               tuple(c.exposed_ports)),
                   m.created_at_ns, m.source, m.in_use, merged, m.merged_count)


@dataclass(frozen=True)
class ImageProgress:
    """A step of a pull/import: layer `layer_index` of `layer_count` (bottom
    first) is in `phase` ("fetching", "converting", "done", "exists":
    converted before), bytes_done of bytes_total of its blob."""

    layer_digest: str
    layer_index: int
    layer_count: int
    phase: str
    bytes_done: int
    bytes_total: int


ProgressFn = Callable[[ImageProgress], Any]


@dataclass(frozen=True)
class PruneResult:
    """Layers the layer GC removed (names) and the bytes their EROFS images
    held."""

    removed: Tuple[str, ...]
    bytes_freed: int


class ImagesCore:
    """Image API (``client.images``)."""

    def __init__(self, client: ClientCore[Any, Any]):
        self._client = client
        self._stub = ipb_grpc.ImagesStub(client._channel)

    def _follow(self, fn: Any, req: Any, progress: Optional[ProgressFn], timeout: Optional[float]) -> Gen[Image]:
        st = yield Open(fn, req, self._client._metadata, timeout)
        image: Optional[Image] = None
        while True:
            m = yield Next(st)
            if m is END:
                break
            if m.HasField("image"):
                image = Image._from_pb(m.image)
            elif progress is not None:
                yield Callback(progress, ImageProgress(m.layer_digest, m.layer_index, m.layer_count, m.phase,
                                                       m.bytes_done, m.bytes_total))
        if image is None:
            raise errors.Internal("image stream ended without the image")
        return image

    @op
    def pull(self, ref: str, *, name: Optional[str] = None, username: Optional[str] = None,
             password: Optional[str] = None, bearer_token: Optional[str] = None, plain_http: bool = False,
             ca_file: Optional[str] = None, platform: Optional[str] = None,
             stall_timeout_s: Optional[int] = None, progress: Optional[ProgressFn] = None,
             timeout: Optional[float] = None) -> Gen[Image]:
        """Pulls ref ("host[:port]/repo[:tag]" or "...@sha256:<hex>") from an
        OCI distribution registry and stores it as `name` (default: ref).

        Layers already in the store (by OCI digest) are neither fetched nor
        converted again. plain_http: speak http:// (default for loopback
        hosts without a ca_file); ca_file: a PEM CA bundle on the node for HTTPS; username /
        password: basic auth (also for a bearer token the registry asks for);
        bearer_token: a ready token. platform: "os/arch" (default
        "linux/amd64"). stall_timeout_s: a transfer that moves nothing this
        long fails with DeadlineExceeded (default 30). progress: called with
        each ImageProgress (awaited on the async client if a coroutine).

        Raises InvalidArgument (bad ref; a layer with "../" paths or device
        nodes, named), FailedPrecondition (no manifest for the platform),
        DataLoss (a blob whose digest does not match), NotFound,
        Unauthenticated, Unavailable, DeadlineExceeded. A failed pull leaves
        no layer and no file behind.
        """
        req = ipb.PullImageRequest(ref=ref, name=name or "", plain_http=plain_http, ca_file=ca_file or "",
                                   platform=platform or "", stall_timeout_s=stall_timeout_s or 0,
                                   auth=ipb.RegistryAuth(username=username or "", password=password or "",
                                                         bearer_token=bearer_token or ""))
        return (yield from self._follow(self._stub.Pull, req, progress, timeout))

    @op
    def import_(self, path: str, *, name: Optional[str] = None, ref_name: Optional[str] = None,
                platform: Optional[str] = None, progress: Optional[ProgressFn] = None,
                timeout: Optional[float] = None) -> Gen[Image]:
        """Imports an OCI image layout directory or a ``docker save`` archive
        at `path` on the daemon's host (unix socket only) as `name` (default:
        the archive's first RepoTag / the layout's ref name). ref_name picks
        a manifest of the layout's index.json. Errors as pull()."""
        req = ipb.ImportImageRequest(path=os.path.abspath(path), name=name or "", ref_name=ref_name or "",
                                     platform=platform or "")
        return (yield from self._follow(self._stub.Import, req, progress, timeout))

    @op
    def get(self, name: str) -> Gen[Image]:
        """The image `name` ("name:tag"; no tag = "latest"). NotFound if absent."""
        return Image._from_pb((yield Rpc(self._stub.Get, ipb.GetImageRequest(name=name), self._client._metadata)))

    @op
    def list(self) -> Gen[List[Image]]:
        """All images of the node, sorted by name."""
        r = yield Rpc(self._stub.List, ipb.ListImagesRequest(), self._client._metadata)
        return [Image._from_pb(x) for x in r.images]

    @op
    def remove(self, name: str) -> Gen[None]:
        """Removes the image and its layers no other image uses.
        FailedPrecondition while a sandbox uses one of its layers."""
        yield Rpc(self._stub.Remove, ipb.RemoveImageRequest(name=name), self._client._metadata)

    @op
    def merge(self, name: str, *, include_top: bool = False, max_bytes: Optional[int] = None,
              progress: Optional[ProgressFn] = None, timeout: Optional[float] = None) -> Gen[Image]:
        """Merges the image's layers offline into one EROFS layer (verified
        against the stacked layers) used by later creates from the image:
        all but the top layer (which stays the image's own layer: a task
        image's workspace), or all with include_top. Images with the same
        lower layers share the merged layer. FailedPrecondition when there
        is nothing to merge or the layers exceed max_bytes (default 3 GiB)."""
        req = ipb.MergeImageRequest(name=name, include_top=include_top, max_bytes=max_bytes or 0)
        return (yield from self._follow(self._stub.Merge, req, progress, timeout))

    @op
    def prune(self) -> Gen[PruneResult]:
        """Layer GC: removes the image layers no image lists and no
        sandbox, pull, merge or create uses (e.g. those an image rm had to
        leave to a create using them)."""
        r = yield Rpc(self._stub.Prune, ipb.PruneImagesRequest(), self._client._metadata)
        return PruneResult(tuple(r.removed), r.bytes_freed)
