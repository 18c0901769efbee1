# warren's /run_jupyter kernel runner (run_code_server.h): one fncall python
# call runs it as its code, so a request's cells run in one jailed python
# process kept for the request (the "kernel"), in order, each in the same
# namespace, as cells of a Jupyter notebook on an IPython kernel do.
#
# In (stdin, JSON): {"cells": [source, ...], "cell_timeout": seconds (<= 0:
# none), "out": path}. Out (the file "out", JSON): {"status": "Finished",
# "cells": [{"stdout", "stderr", "display": [mime bundle], "error": [{"ename",
# "evalue", "traceback": [str]}]}]}: SandboxFusion's CellRunResult per cell.
#
# Why not ipykernel: no layer ships it (Debian's python3-ipykernel is not
# among the toolsets), and a kernel behind jupyter_client needs ZMQ sockets
# and ~1 s to start per request; what SandboxFusion's runner reads back from
# its kernel (stream text, display_data/execute_result bundles, error
# contents) is made here with the standard library:
#   * stdout/stderr: the cell's writes to fds 1 and 2 (print, sys.stderr,
#     subprocesses), captured in files per cell;
#   * display: the value of a cell's last expression statement unless the
#     cell ends with ';' (IPython's last_expr), and display(obj, ...) calls;
#     a bundle has "text/plain" (pprint, as IPython's pretty printer wraps at
#     79 columns) and what the object's _repr_html_/_repr_markdown_/
#     _repr_svg_/_repr_png_/_repr_jpeg_/_repr_latex_/_repr_json_/
#     _repr_mimebundle_ give (binary data base64), as IPython's formatters;
#   * error: an exception the cell did not catch, SystemExit and
#     KeyboardInterrupt included; the next cell runs (Jupyter's behaviour);
#   * cell_timeout: SIGALRM interrupts the cell with TimeoutError (its error),
#     the kernel and the later cells go on; the total time-out is the call's.
# Not IPython: no magics (%...) or shell escapes (!...): a SyntaxError, as in
# plain python; input() sees end of file (Jupyter has no stdin for it here).
import ast
import base64
import builtins
import json
import linecache
import os
import pprint
import signal
import sys
import tempfile
import traceback
import types

_MIMES = (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"), ("_repr_svg_", "image/svg+xml"),
          ("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"), ("_repr_latex_", "text/latex"),
          ("_repr_json_", "application/json"))
_current = None  # the running cell's result dict


def _bundle(obj):
    data = {}
    kind = type(obj)
    try:
        if getattr(kind, "_repr_mimebundle_", None) is not None:
            r = obj._repr_mimebundle_()
            if isinstance(r, tuple):
                r = r[0]
            if isinstance(r, dict):
                data.update(r)
    except Exception:  # noqa: BLE001 -- IPython ignores a failing formatter too
        pass
    for meth, mime in _MIMES:
        if mime in data or getattr(kind, meth, None) is None:
            continue
        try:
            v = getattr(obj, meth)()
        except Exception:  # noqa: BLE001
            continue
        if isinstance(v, tuple):
            v = v[0]
        if isinstance(v, (bytes, bytearray)):
            v = base64.b64encode(bytes(v)).decode()
        if v is not None:
            data[mime] = v
    try:
        data["text/plain"] = pprint.pformat(obj, width=79, sort_dicts=False)
    except Exception:  # noqa: BLE001
        data["text/plain"] = object.__repr__(obj)
    return data


def display(*objs, **_kw):
    """IPython.display.display: one display entry per object."""
    for o in objs:
        if _current is not None:
            _current["display"].append(_bundle(o))


class _CellTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CellTimeout()


def _error(e, filename, timeout):
    if isinstance(e, _CellTimeout):
        e = TimeoutError(f"the cell ran longer than its cell_timeout ({timeout:g} s)")
        lines = traceback.format_exception_only(type(e), e)
        return {"ename": "TimeoutError", "evalue": str(e), "traceback": ["Traceback (most recent call last):\n"] + lines}
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next  # drop the runner's own frames
    lines = traceback.format_exception(type(e), e, tb)
    return {"ename": type(e).__name__, "evalue": str(e), "traceback": lines}


def _run(src, ns, n, timeout):
    filename = f"<cell {n}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    try:
        tree = ast.parse(src, filename)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not src.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        code = compile(tree, filename, "exec")
        expr = compile(last, filename, "eval") if last is not None else None
        if timeout > 0:
            signal.setitimer(signal.ITIMER_REAL, timeout)
        try:
            exec(code, ns)
            if expr is not None:
                v = eval(expr, ns)
                if v is not None:
                    ns["_"] = v
                    display(v)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as e:  # noqa: BLE001 -- a cell's failure is its result
        _current["error"].append(_error(e, filename, timeout))


def main():
    global _current
    req = json.loads(sys.stdin.read())
    timeout = float(req.get("cell_timeout") or 0)
    main_mod = types.ModuleType("__main__")  # the cells' module: pickle and friends find their names
    main_mod.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main_mod
    builtins.display = display
    signal.signal(signal.SIGALRM, _alarm)
    keep = (os.dup(1), os.dup(2))
    cells = []
    for n, src in enumerate(req["cells"], 1):
        _current = {"stdout": "", "stderr": "", "display": [], "error": []}
        files = (tempfile.TemporaryFile(dir="/tmp"), tempfile.TemporaryFile(dir="/tmp"))
        for s in (sys.stdout, sys.stderr):
            s.flush()
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        try:
            _run(src, main_mod.__dict__, n, timeout)
        finally:
            for s in (sys.stdout, sys.stderr):
                try:
                    s.flush()
                except Exception:  # noqa: BLE001 -- a cell may have closed or replaced them
                    pass
            os.dup2(keep[0], 1)
            os.dup2(keep[1], 2)
        for key, f in zip(("stdout", "stderr"), files):
            f.seek(0)
            _current[key] = f.read().decode("utf-8", "replace")
            f.close()
        cells.append(_current)
    with open(req["out"], "w", encoding="utf-8") as f:
        json.dump({"status": "Finished", "cells": cells}, f, default=repr)


main()
