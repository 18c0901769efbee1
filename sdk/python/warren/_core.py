"""The one implementation behind the sync and the async SDK.

Every public method of the SDK is written once, as a generator (a "core
method") that builds requests, parses answers and decides retries, and
yields an *effect* wherever it needs I/O: an RPC, the next message of a
stream, a sleep, a background task. Two drivers carry effects out: `run_sync`
on a blocking grpc channel, `run_async` on a grpc.aio channel. A core method
is exposed through the `op` descriptor: on a sync class (`Sync`) it is a
plain method, on an async class (`Async`) a coroutine method with the same
parameters. Sync and async surface classes are subclasses of the same core
class, so a method cannot exist on one side only.

Errors: the drivers map grpc.RpcError (and grpc's ValueError on a closed
channel) to the matching WarrenError and throw it into the core method at
the yield, so core code handles one set of exceptions for both sides.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import queue
import threading
import time
from dataclasses import dataclass
from typing import (
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Concatenate,
    Generator,
    Generic,
    Iterator,
    Optional,
    ParamSpec,
    Type,
    TypeVar,
    overload,
)

import grpc
import grpc.aio

from . import errors

S = TypeVar("S")
R = TypeVar("R")
T = TypeVar("T")
P = ParamSpec("P")
# A core method: yields effects, receives their results, returns R.
Gen = Generator[Any, Any, R]

# What a stream's Next gives at its end.
END: Any = object()


# ---------------------------------------------------------------- effects

@dataclass
class Rpc:
    """A unary call: returns the response."""
    fn: Any
    req: Any
    md: Any
    timeout: Optional[float] = None


@dataclass
class RpcStreamIn:
    """A client-streaming call fed from a (blocking) iterator of requests. An
    exception the iterator raises is raised instead of gRPC's UNKNOWN."""
    fn: Any
    reqs: Iterator[Any]
    md: Any
    timeout: Optional[float] = None


@dataclass
class Open:
    """A server-streaming call: returns a Stream handle (read with Next)."""
    fn: Any
    req: Any
    md: Any
    timeout: Optional[float] = None


@dataclass
class OpenBidi:
    """A bidirectional call: returns a Stream handle (Send, DoneWriting, Next)."""
    fn: Any
    md: Any
    timeout: Optional[float] = None


@dataclass
class Next:
    """The next message of a stream, or END."""
    stream: Stream


@dataclass
class Send:
    stream: Stream
    msg: Any


@dataclass
class DoneWriting:
    """Ends the request side of a bidi stream (idempotent, never raises)."""
    stream: Stream


@dataclass
class Sleep:
    seconds: float


@dataclass
class Background:
    """Runs a core method in the background (a thread / a task of the
    loop), tracked by `owner._background` so close() can wait for it."""
    owner: Any
    gen: Gen[None]


@dataclass
class WaitBackground:
    """Waits up to `timeout` seconds for owner's background work."""
    owner: Any
    timeout: float


@dataclass
class CloseChannel:
    channel: Any


@dataclass
class Callback:
    """Calls a user callback (awaited when it returns a coroutine)."""
    fn: Callable[[Any], Any]
    arg: Any


@dataclass
class Acquire:
    """Takes a lock of the side's kind (Sync: threading.Lock, Async:
    asyncio.Lock); the core releases it with lock.release()."""
    lock: Any


@dataclass
class Emit:
    """A value handed to the user by an iterating core method."""
    value: Any


@dataclass
class AwaitKick:
    """Async only: waits for the work started by Async._kick."""
    task: asyncio.Future[Any]


@dataclass
class Stream:
    """Handle of a streaming call of either side. cancel() is plain on both."""
    call: Any
    requests: Optional[queue.Queue[Any]] = None
    input_done: bool = False

    def cancel(self) -> None:
        self.end_input()
        self.call.cancel()

    def end_input(self) -> None:
        if self.requests is not None and not self.input_done:
            self.input_done = True
            self.requests.put(None)


# ---------------------------------------------------------------- drivers

def _map_error(e: BaseException) -> BaseException:
    if isinstance(e, grpc.RpcError):
        w: BaseException = errors.from_rpc_error(e)
    elif isinstance(e, ValueError):
        w = errors.from_closed_channel(e) or e
    else:
        return e
    w.__suppress_context__ = True
    return w


class _RequestErrors:
    """Keeps an exception raised while gRPC iterated a request stream (gRPC
    reports it only as UNKNOWN "Exception iterating requests!")."""

    def __init__(self) -> None:
        self.error: Optional[BaseException] = None

    def wrap(self, it: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from it
        except Exception as e:  # re-raised by the driver
            self.error = e
            raise

    async def wrap_async(self, it: Iterator[Any]) -> AsyncIterator[Any]:
        try:
            for r in it:
                yield r
        except Exception as e:  # re-raised by the driver
            self.error = e
            raise


def _queue_requests(q: queue.Queue[Any]) -> Iterator[Any]:
    while True:
        m = q.get()
        if m is None:
            return
        yield m


def _do_sync(eff: Any) -> Any:
    t = type(eff)
    if t is Rpc:
        return eff.fn(eff.req, metadata=eff.md, timeout=eff.timeout)
    if t is Next:
        try:
            return next(eff.stream.call)
        except StopIteration:
            return END
    if t is Open:
        return Stream(eff.fn(eff.req, metadata=eff.md, timeout=eff.timeout))
    if t is Send:
        if not eff.stream.input_done:
            assert eff.stream.requests is not None
            eff.stream.requests.put(eff.msg)
        return None
    if t is DoneWriting:
        eff.stream.end_input()
        return None
    if t is OpenBidi:
        q: queue.Queue[Any] = queue.Queue()
        st = Stream(None, q)
        st.call = eff.fn(_queue_requests(q), metadata=eff.md, timeout=eff.timeout)
        # gRPC reads the requests on a thread of its own: however the call
        # ends, the request stream must end too, or that thread blocks on
        # the queue forever.
        st.call.add_done_callback(lambda _c: st.end_input())
        return st
    if t is RpcStreamIn:
        rq = _RequestErrors()
        try:
            return eff.fn(rq.wrap(eff.reqs), metadata=eff.md, timeout=eff.timeout)
        except grpc.RpcError:
            if rq.error is not None:
                raise rq.error from None
            raise
    if t is Sleep:
        time.sleep(eff.seconds)
        return None
    if t is Callback:
        return eff.fn(eff.arg)
    if t is Acquire:
        eff.lock.acquire()
        return None
    if t is Background:
        owner = eff.owner
        gen = eff.gen

        def run() -> None:
            try:
                run_sync(gen)
            except Exception:  # nothing to report to: background work is best-effort
                pass
            finally:
                with owner._background_lock:
                    owner._background.discard(threading.current_thread())

        th = threading.Thread(target=run, name="warren-background", daemon=True)
        # Added and started under the lock: a close() on another thread
        # (WaitBackground) must never see, and join, a thread not yet started.
        with owner._background_lock:
            owner._background.add(th)
            th.start()
        return None
    if t is WaitBackground:
        end = time.monotonic() + eff.timeout
        with eff.owner._background_lock:
            pending = list(eff.owner._background)
        for th in pending:
            th.join(max(0.0, end - time.monotonic()))
        return None
    if t is CloseChannel:
        eff.channel.close()
        return None
    raise TypeError(f"unknown effect {eff!r}")


def _step(gen: Gen[R], send: Any, exc: Optional[BaseException]) -> Any:
    return gen.throw(exc) if exc is not None else gen.send(send)


def run_sync(gen: Gen[R]) -> R:
    """Runs a core method to its end on the calling thread."""
    send: Any = None
    exc: Optional[BaseException] = None
    while True:
        try:
            eff = _step(gen, send, exc)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, exc = None, None
        try:
            send = _do_sync(eff)
        except BaseException as e:  # thrown into the core method
            exc = _map_error(e)


def iter_sync(gen: Gen[None]) -> Iterator[Any]:
    """Runs an iterating core method, yielding what it emits."""
    send: Any = None
    exc: Optional[BaseException] = None
    try:
        while True:
            try:
                eff = _step(gen, send, exc)
            except StopIteration:
                return
            send, exc = None, None
            if type(eff) is Emit:
                yield eff.value
                continue
            try:
                send = _do_sync(eff)
            except BaseException as e:
                exc = _map_error(e)
    finally:
        gen.close()


async def _do_async(eff: Any) -> Any:
    t = type(eff)
    if t is Rpc:
        return await eff.fn(eff.req, metadata=eff.md, timeout=eff.timeout)
    if t is Next:
        m = await eff.stream.call.read()
        return END if m is grpc.aio.EOF else m
    if t is Open:
        return Stream(eff.fn(eff.req, metadata=eff.md, timeout=eff.timeout))
    if t is Send:
        if not eff.stream.input_done:
            await eff.stream.call.write(eff.msg)
        return None
    if t is DoneWriting:
        st = eff.stream
        if not st.input_done:
            st.input_done = True
            try:
                await st.call.done_writing()
            except (grpc.RpcError, asyncio.InvalidStateError):
                pass
        return None
    if t is OpenBidi:
        return Stream(eff.fn(metadata=eff.md, timeout=eff.timeout))
    if t is RpcStreamIn:
        rq = _RequestErrors()
        try:
            return await eff.fn(rq.wrap_async(eff.reqs), metadata=eff.md, timeout=eff.timeout)
        except grpc.RpcError:
            if rq.error is not None:
                raise rq.error from None
            raise
    if t is Sleep:
        await asyncio.sleep(eff.seconds)
        return None
    if t is Callback:
        r = eff.fn(eff.arg)
        if inspect.isawaitable(r):
            r = await r
        return r
    if t is Acquire:
        await eff.lock.acquire()
        return None
    if t is Background:
        owner = eff.owner

        async def run(gen: Gen[None]) -> None:
            try:
                await run_async(gen)
            except Exception:  # best-effort, as on the sync side
                pass

        task = asyncio.get_running_loop().create_task(run(eff.gen))
        owner._background.add(task)
        task.add_done_callback(owner._background.discard)
        return None
    if t is WaitBackground:
        if eff.owner._background:
            await asyncio.wait(list(eff.owner._background), timeout=eff.timeout)
        return None
    if t is CloseChannel:
        await eff.channel.close()
        return None
    if t is AwaitKick:
        return await asyncio.shield(eff.task)
    raise TypeError(f"unknown effect {eff!r}")


async def run_async(gen: Gen[R]) -> R:
    """Runs a core method to its end on the running event loop."""
    send: Any = None
    exc: Optional[BaseException] = None
    while True:
        try:
            eff = _step(gen, send, exc)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        send, exc = None, None
        try:
            send = await _do_async(eff)
        except BaseException as e:  # thrown into the core method
            exc = _map_error(e)


async def iter_async(gen: Gen[None]) -> AsyncIterator[Any]:
    """Runs an iterating core method, yielding what it emits."""
    send: Any = None
    exc: Optional[BaseException] = None
    try:
        while True:
            try:
                eff = _step(gen, send, exc)
            except StopIteration:
                return
            send, exc = None, None
            if type(eff) is Emit:
                yield eff.value
                continue
            try:
                send = await _do_async(eff)
            except BaseException as e:
                exc = _map_error(e)
    finally:
        gen.close()


# ---------------------------------------------------------------- sides

class Sync:
    """Marks a surface class whose ops are plain methods."""

    _is_async = False

    @staticmethod
    def _new_lock() -> Any:
        return threading.Lock()

    def _kick(self, gen: Gen[Any]) -> None:
        """Starts a core method now (before the caller iterates)."""
        run_sync(gen)

    def _kicked(self) -> Gen[None]:
        yield from ()  # nothing to wait for: _kick ran it


class Async:
    """Marks a surface class whose ops are coroutine methods."""

    _is_async = True
    _kick_task: Optional[asyncio.Future[Any]] = None

    @staticmethod
    def _new_lock() -> Any:
        return asyncio.Lock()

    def _kick(self, gen: Gen[Any]) -> None:
        self._kick_task = asyncio.ensure_future(run_async(gen))

    def _kicked(self) -> Gen[None]:
        if self._kick_task is not None:
            yield AwaitKick(self._kick_task)


class op(Generic[S, P, R]):
    """A core method exposed as a method (Sync) or a coroutine method (Async)
    of the surface class, with the same parameters."""

    def __init__(self, fn: Callable[Concatenate[S, P], Gen[R]]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        sig = inspect.signature(fn)
        self._sig = sig.replace(parameters=list(sig.parameters.values())[1:])

    @overload
    def __get__(self, obj: None, owner: Any) -> op[S, P, R]: ...

    @overload
    def __get__(self, obj: Sync, owner: Any) -> Callable[P, R]: ...

    @overload
    def __get__(self, obj: Async, owner: Any) -> Callable[P, Awaitable[R]]: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        if obj is None:
            return self
        fn = self.fn
        if obj._is_async:
            async def a(*args: Any, **kwargs: Any) -> Any:
                return await run_async(fn(obj, *args, **kwargs))
            w: Any = a
        else:
            def s(*args: Any, **kwargs: Any) -> Any:
                return run_sync(fn(obj, *args, **kwargs))
            w = s
        w.__name__ = fn.__name__
        w.__qualname__ = fn.__qualname__
        w.__doc__ = fn.__doc__
        w.__signature__ = self._sig
        return w


class stream_op(Generic[S, P, T]):
    """An iterating core method (it yields Emit(value)s) exposed as a method
    returning an iterator (Sync) or an async iterator (Async)."""

    def __init__(self, item: Type[T], fn: Callable[Concatenate[S, P], Gen[None]]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        sig = inspect.signature(fn)
        self._sig = sig.replace(parameters=list(sig.parameters.values())[1:])

    @overload
    def __get__(self, obj: None, owner: Any) -> stream_op[S, P, T]: ...

    @overload
    def __get__(self, obj: Sync, owner: Any) -> Callable[P, Iterator[T]]: ...

    @overload
    def __get__(self, obj: Async, owner: Any) -> Callable[P, AsyncIterator[T]]: ...

    def __get__(self, obj: Any, owner: Any) -> Any:
        if obj is None:
            return self
        fn = self.fn
        if obj._is_async:
            def a(*args: Any, **kwargs: Any) -> Any:
                return iter_async(fn(obj, *args, **kwargs))
            w: Any = a
        else:
            def s(*args: Any, **kwargs: Any) -> Any:
                return iter_sync(fn(obj, *args, **kwargs))
            w = s
        w.__name__ = fn.__name__
        w.__qualname__ = fn.__qualname__
        w.__doc__ = fn.__doc__
        w.__signature__ = self._sig
        return w


def streaming(item: Type[T]) -> Callable[[Callable[Concatenate[S, P], Gen[None]]], stream_op[S, P, T]]:
    """Decorator: @streaming(bytes) over an iterating core method."""
    def deco(fn: Callable[Concatenate[S, P], Gen[None]]) -> stream_op[S, P, T]:
        return stream_op(item, fn)
    return deco


# The context-manager and iteration protocols of each side: `_exit()` and
# `_events()` are core methods of the class that mixes these in.

class SyncContext(Sync):
    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: Any) -> None:
        run_sync(self._exit())  # type: ignore[attr-defined]


class AsyncContext(Async):
    async def __aenter__(self: S) -> S:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await run_async(self._exit())  # type: ignore[attr-defined]


class SyncIterable(Sync):
    def __iter__(self) -> Iterator[Any]:
        return iter_sync(self._events())  # type: ignore[attr-defined]


class AsyncIterable(Async):
    def __aiter__(self) -> AsyncIterator[Any]:
        return iter_async(self._events())  # type: ignore[attr-defined]
