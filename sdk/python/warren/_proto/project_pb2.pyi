from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProjectQuota(_message.Message):
    __slots__ = ("sandboxes", "cpu_millis", "memory_mb", "creates_per_second", "create_burst")
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    CREATES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CREATE_BURST_FIELD_NUMBER: _ClassVar[int]
    sandboxes: int
    cpu_millis: int
    memory_mb: int
    creates_per_second: float
    create_burst: int
    def __init__(self, sandboxes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., memory_mb: _Optional[int] = ..., creates_per_second: _Optional[float] = ..., create_burst: _Optional[int] = ...) -> None: ...

class ProjectUsage(_message.Message):
    __slots__ = ("sandboxes", "cpu_millis", "memory_mb")
    SANDBOXES_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLIS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MB_FIELD_NUMBER: _ClassVar[int]
    sandboxes: int
    cpu_millis: int
    memory_mb: int
    def __init__(self, sandboxes: _Optional[int] = ..., cpu_millis: _Optional[int] = ..., memory_mb: _Optional[int] = ...) -> None: ...

class Project(_message.Message):
    __slots__ = ("path", "quota", "usage", "created_ns")
    PATH_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    path: str
    quota: ProjectQuota
    usage: ProjectUsage
    created_ns: int
    def __init__(self, path: _Optional[str] = ..., quota: _Optional[_Union[ProjectQuota, _Mapping]] = ..., usage: _Optional[_Union[ProjectUsage, _Mapping]] = ..., created_ns: _Optional[int] = ...) -> None: ...

class CreateProjectRequest(_message.Message):
    __slots__ = ("path", "quota")
    PATH_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    path: str
    quota: ProjectQuota
    def __init__(self, path: _Optional[str] = ..., quota: _Optional[_Union[ProjectQuota, _Mapping]] = ...) -> None: ...

class CreateProjectResponse(_message.Message):
    __slots__ = ("project", "token")
    PROJECT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    project: Project
    token: str
    def __init__(self, project: _Optional[_Union[Project, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class GetProjectRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class ListProjectsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListProjectsResponse(_message.Message):
    __slots__ = ("projects",)
    PROJECTS_FIELD_NUMBER: _ClassVar[int]
    projects: _containers.RepeatedCompositeFieldContainer[Project]
    def __init__(self, projects: _Optional[_Iterable[_Union[Project, _Mapping]]] = ...) -> None: ...

class UpdateProjectRequest(_message.Message):
    __slots__ = ("path", "quota")
    PATH_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    path: str
    quota: ProjectQuota
    def __init__(self, path: _Optional[str] = ..., quota: _Optional[_Union[ProjectQuota, _Mapping]] = ...) -> None: ...

class DeleteProjectRequest(_message.Message):
    __slots__ = ("path",)
    PATH_FIELD_NUMBER: _ClassVar[int]
    path: str
    def __init__(self, path: _Optional[str] = ...) -> None: ...

class DeleteProjectResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
