from warren.v1 import warren_pb2 as _warren_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MouseButton(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MOUSE_BUTTON_NONE: _ClassVar[MouseButton]
    MOUSE_BUTTON_LEFT: _ClassVar[MouseButton]
    MOUSE_BUTTON_MIDDLE: _ClassVar[MouseButton]
    MOUSE_BUTTON_RIGHT: _ClassVar[MouseButton]

class MouseAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MOUSE_ACTION_MOVE: _ClassVar[MouseAction]
    MOUSE_ACTION_CLICK: _ClassVar[MouseAction]
    MOUSE_ACTION_DOWN: _ClassVar[MouseAction]
    MOUSE_ACTION_UP: _ClassVar[MouseAction]
MOUSE_BUTTON_NONE: MouseButton
MOUSE_BUTTON_LEFT: MouseButton
MOUSE_BUTTON_MIDDLE: MouseButton
MOUSE_BUTTON_RIGHT: MouseButton
MOUSE_ACTION_MOVE: MouseAction
MOUSE_ACTION_CLICK: MouseAction
MOUSE_ACTION_DOWN: MouseAction
MOUSE_ACTION_UP: MouseAction

class ScreenshotRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class ScreenImage(_message.Message):
    __slots__ = ("png", "width", "height")
    PNG_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    HEIGHT_FIELD_NUMBER: _ClassVar[int]
    png: bytes
    width: int
    height: int
    def __init__(self, png: _Optional[bytes] = ..., width: _Optional[int] = ..., height: _Optional[int] = ...) -> None: ...

class KeyInput(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: str
    def __init__(self, keys: _Optional[str] = ...) -> None: ...

class TypeInput(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class MouseInput(_message.Message):
    __slots__ = ("x", "y", "button", "action")
    X_FIELD_NUMBER: _ClassVar[int]
    Y_FIELD_NUMBER: _ClassVar[int]
    BUTTON_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    x: int
    y: int
    button: MouseButton
    action: MouseAction
    def __init__(self, x: _Optional[int] = ..., y: _Optional[int] = ..., button: _Optional[_Union[MouseButton, str]] = ..., action: _Optional[_Union[MouseAction, str]] = ...) -> None: ...

class ScrollInput(_message.Message):
    __slots__ = ("dx", "dy")
    DX_FIELD_NUMBER: _ClassVar[int]
    DY_FIELD_NUMBER: _ClassVar[int]
    dx: int
    dy: int
    def __init__(self, dx: _Optional[int] = ..., dy: _Optional[int] = ...) -> None: ...

class InputRequest(_message.Message):
    __slots__ = ("id", "key", "type", "mouse", "scroll")
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MOUSE_FIELD_NUMBER: _ClassVar[int]
    SCROLL_FIELD_NUMBER: _ClassVar[int]
    id: str
    key: KeyInput
    type: TypeInput
    mouse: MouseInput
    scroll: ScrollInput
    def __init__(self, id: _Optional[str] = ..., key: _Optional[_Union[KeyInput, _Mapping]] = ..., type: _Optional[_Union[TypeInput, _Mapping]] = ..., mouse: _Optional[_Union[MouseInput, _Mapping]] = ..., scroll: _Optional[_Union[ScrollInput, _Mapping]] = ...) -> None: ...
