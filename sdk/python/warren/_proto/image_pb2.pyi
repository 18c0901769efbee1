from warren.v1 import warren_pb2 as _warren_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegistryAuth(_message.Message):
    __slots__ = ("username", "password", "bearer_token")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    PASSWORD_FIELD_NUMBER: _ClassVar[int]
    BEARER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    username: str
    password: str
    bearer_token: str
    def __init__(self, username: _Optional[str] = ..., password: _Optional[str] = ..., bearer_token: _Optional[str] = ...) -> None: ...

class PullImageRequest(_message.Message):
    __slots__ = ("ref", "name", "auth", "plain_http", "ca_file", "platform", "stall_timeout_s")
    REF_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    AUTH_FIELD_NUMBER: _ClassVar[int]
    PLAIN_HTTP_FIELD_NUMBER: _ClassVar[int]
    CA_FILE_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    STALL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ref: str
    name: str
    auth: RegistryAuth
    plain_http: bool
    ca_file: str
    platform: str
    stall_timeout_s: int
    def __init__(self, ref: _Optional[str] = ..., name: _Optional[str] = ..., auth: _Optional[_Union[RegistryAuth, _Mapping]] = ..., plain_http: _Optional[bool] = ..., ca_file: _Optional[str] = ..., platform: _Optional[str] = ..., stall_timeout_s: _Optional[int] = ...) -> None: ...

class ImportImageRequest(_message.Message):
    __slots__ = ("path", "name", "ref_name", "platform")
    PATH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REF_NAME_FIELD_NUMBER: _ClassVar[int]
    PLATFORM_FIELD_NUMBER: _ClassVar[int]
    path: str
    name: str
    ref_name: str
    platform: str
    def __init__(self, path: _Optional[str] = ..., name: _Optional[str] = ..., ref_name: _Optional[str] = ..., platform: _Optional[str] = ...) -> None: ...

class ImageConfig(_message.Message):
    __slots__ = ("env", "workdir", "user", "entrypoint", "cmd", "exposed_ports")
    ENV_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    CMD_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_PORTS_FIELD_NUMBER: _ClassVar[int]
    env: _containers.RepeatedScalarFieldContainer[str]
    workdir: str
    user: str
    entrypoint: _containers.RepeatedScalarFieldContainer[str]
    cmd: _containers.RepeatedScalarFieldContainer[str]
    exposed_ports: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env: _Optional[_Iterable[str]] = ..., workdir: _Optional[str] = ..., user: _Optional[str] = ..., entrypoint: _Optional[_Iterable[str]] = ..., cmd: _Optional[_Iterable[str]] = ..., exposed_ports: _Optional[_Iterable[str]] = ...) -> None: ...

class ImageLayer(_message.Message):
    __slots__ = ("digest", "layer", "layer_name", "size_bytes")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    LAYER_NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    layer: str
    layer_name: str
    size_bytes: int
    def __init__(self, digest: _Optional[str] = ..., layer: _Optional[str] = ..., layer_name: _Optional[str] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("name", "digest", "layers", "config", "created_at_ns", "source", "in_use", "merged", "merged_count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_NS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    IN_USE_FIELD_NUMBER: _ClassVar[int]
    MERGED_FIELD_NUMBER: _ClassVar[int]
    MERGED_COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    digest: str
    layers: _containers.RepeatedCompositeFieldContainer[ImageLayer]
    config: ImageConfig
    created_at_ns: int
    source: str
    in_use: int
    merged: ImageLayer
    merged_count: int
    def __init__(self, name: _Optional[str] = ..., digest: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[ImageLayer, _Mapping]]] = ..., config: _Optional[_Union[ImageConfig, _Mapping]] = ..., created_at_ns: _Optional[int] = ..., source: _Optional[str] = ..., in_use: _Optional[int] = ..., merged: _Optional[_Union[ImageLayer, _Mapping]] = ..., merged_count: _Optional[int] = ...) -> None: ...

class ImageProgress(_message.Message):
    __slots__ = ("layer_digest", "layer_index", "layer_count", "phase", "bytes_done", "bytes_total", "image")
    LAYER_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LAYER_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAYER_COUNT_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    layer_digest: str
    layer_index: int
    layer_count: int
    phase: str
    bytes_done: int
    bytes_total: int
    image: Image
    def __init__(self, layer_digest: _Optional[str] = ..., layer_index: _Optional[int] = ..., layer_count: _Optional[int] = ..., phase: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., image: _Optional[_Union[Image, _Mapping]] = ...) -> None: ...

class GetImageRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[Image]
    def __init__(self, images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ...) -> None: ...

class RemoveImageRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class MergeImageRequest(_message.Message):
    __slots__ = ("name", "include_top", "max_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TOP_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    include_top: bool
    max_bytes: int
    def __init__(self, name: _Optional[str] = ..., include_top: _Optional[bool] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class PruneImagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PruneImagesResponse(_message.Message):
    __slots__ = ("removed", "bytes_freed")
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    BYTES_FREED_FIELD_NUMBER: _ClassVar[int]
    removed: _containers.RepeatedScalarFieldContainer[str]
    bytes_freed: int
    def __init__(self, removed: _Optional[_Iterable[str]] = ..., bytes_freed: _Optional[int] = ...) -> None: ...
