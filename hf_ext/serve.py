"""`hf-ext serve MODEL`: a model's interactive app in the browser (Gradio), chosen by the model's type.

The apps live with their models: `hf_ext/models/<m>/app.py`, with the model types it serves (`MODEL_TYPES`) and
`build_app(source, trust_remote_code, model_kwargs)`, which imports gradio. What is shared is here: the command (its
`--device` and `--dtype` reach the app as `model_kwargs`), finding the app through `MODELS`, the limits on what a
request may hold, turning failures into one message in the page (`gr.Error`) and launching on a local address with
nothing sent anywhere else: no run history, no uploads, no URL fetched for a client, no request from another web
origin, and Gradio's temporary files in a private folder removed at the end. Gradio is optional (the `app` extra).
"""

import argparse
import contextlib
import functools
import html
import inspect
import ipaddress
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from transformers.utils import logging

from .arguments import number_in
from .cli_utils import add_device_arguments, add_model_argument, model_loading_settings
from .errors import HfExtError, one_line
from .extras import install_command
from .loading import load_config
from .models import MODELS, modules_by_model_type

if TYPE_CHECKING:  # gradio is optional
    import gradio as gr

logger = logging.get_logger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 7860
# what one request may carry: a text box holds a sentence or two, a request a few of them
MAX_TEXT_CHARS = 500
MAX_REQUEST_BYTES = 64 * 1024
# requests waiting for the model, which answers one at a time (its forward passes share one set of weights and threads)
MAX_QUEUED = 32
# Gradio routes the apps never use, answered 404 before Gradio sees them: uploads (the apps take text only), fetching
# a URL for the client (`file=http...`, `proxy=`), and the run history, which calls the Hub with the serving user's
# token (Gradio 6.18 and later)
REFUSED_ROUTE = re.compile(r"(?:/gradio_api)?/(?:upload|upload_progress|proxy=.*|file=[A-Za-z][A-Za-z0-9+.-]*:.*"
                           r"|runs|run-history(?:/.*)?)/?")
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    """The top-level `hf-ext serve` command."""
    served = [entry for entry in MODELS if entry.app is not None]
    parser = commands.add_parser(
        "serve", help=f"explore a model in the browser ({', '.join(entry.display_name for entry in served)})",
        description="Start the model's app in the browser, chosen by its model type: "
        f"{', '.join(entry.app_summary or entry.display_name for entry in served)}. Each function is also served "
        "by name through Gradio's API (gradio_client). Needs the app extra (docs/install.md).")
    add_model_argument(parser, "model folder or Hub repo id (offline when HF_HUB_OFFLINE=1)")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0 opens the "
                        "app to every machine that can reach this one)")
    parser.add_argument("--port", type=number_in(int, 1, 65535), default=DEFAULT_PORT,
                        help=f"port to listen on (default {DEFAULT_PORT})")
    add_device_arguments(parser)
    parser.set_defaults(handler=_run_serve)


def require_gradio() -> ModuleType:
    """The gradio module, with its telemetry and update check off; one clear error when the app extra is missing."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # hf-ext sends nothing anywhere: no telemetry, no update check
    try:
        import gradio
    except ImportError:
        raise HfExtError(f"hf-ext serve needs the app extra: {install_command('app')}") from None
    return gradio


def apps() -> dict[str, ModuleType]:
    """`{model_type: app module}` over the models that have an app."""
    return modules_by_model_type("app")


def app_module(model_type: str) -> ModuleType:
    """The app module serving `model_type`; one error line naming the types that have an app otherwise."""
    found = apps()
    if model_type not in found:
        raise HfExtError(f"no app for model type {model_type!r} (hf-ext serve has apps for "
                         f"{', '.join(sorted(found))})")
    require_gradio()
    return found[model_type]


def build_app(source: str, trust_remote_code: bool = False,
              before_loading: Callable[[], None] | None = None,
              model_kwargs: dict[str, Any] | None = None) -> "gr.Blocks":
    """The `gr.Blocks` app of the model in `source` (a folder or Hub repo id), chosen by its model type;
    `before_loading` runs once the folder is known to have an app and gradio is there, before the model loads;
    `model_kwargs` go to the model's `from_pretrained` (`dtype`, `device_map`)."""
    config = load_config(source, trust_remote_code=trust_remote_code)
    module = app_module(config.model_type)
    if before_loading is not None:
        before_loading()
    return module.build_app(source, trust_remote_code, model_kwargs=model_kwargs)


def check_port_free(host: str, port: int) -> None:
    """Raise `HfExtError` (one line) when nothing can listen on HOST:PORT, before the model loads: Gradio finds out
    only when it starts, after the loading, and says it in a paragraph of its own. A probe, not a reservation: what
    takes the port between this and `launch` still fails there, with the same line."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # as the server will: a port whose earlier connections are only closing is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as error:
        raise HfExtError(f"cannot listen on {host}:{port}: {error.strerror or one_line(error)}") from None


def launch(app: "gr.Blocks", host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
    """Start `app` on http://HOST:PORT in a background thread (stop it with `app.close()`), its requests queued and
    bounded in size, no public share link, no server-side rendering, no run history, and the routes and origins that
    `ServedRequests` refuses refused. Returns the local URL."""
    from starlette.middleware import Middleware

    app.queue(max_size=MAX_QUEUED, default_concurrency_limit=1)
    # the run history (Gradio 6.18 and later) records calls and offers to store them on the Hub, with the serving
    # user's token: off (earlier releases have none, and no such option)
    history: dict[str, Any] = {"run_history": False} if "run_history" in inspect.signature(app.launch).parameters \
        else {}
    try:
        _, url, _ = app.launch(server_name=host, server_port=port, share=False, prevent_thread_lock=True,
                               quiet=True, ssr_mode=False, mcp_server=False, max_file_size=MAX_REQUEST_BYTES,
                               app_kwargs={"middleware": [Middleware(ServedRequests, host=host),
                                                          Middleware(RequestSizeLimit, max_bytes=MAX_REQUEST_BYTES)]},
                               **history)
    except OSError as error:
        raise HfExtError(f"cannot listen on {host}:{port}: {one_line(error)}") from None
    return url


@contextlib.contextmanager
def private_gradio_cache() -> Iterator[Path]:
    """Gradio's temporary files (`GRADIO_TEMP_DIR`, read when an app is built and launched) in a folder of this run's
    own, which only this user can read, removed on the way out: nothing is left in the shared /tmp/gradio."""
    folder = Path(tempfile.mkdtemp(prefix="hf-ext-serve-"))
    previous = os.environ.get("GRADIO_TEMP_DIR")
    os.environ["GRADIO_TEMP_DIR"] = str(folder)
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop("GRADIO_TEMP_DIR", None)
        else:
            os.environ["GRADIO_TEMP_DIR"] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _hostname(host: str) -> str:
    """The name in a Host header, without its port ("[::1]:7860" -> "::1")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class ServedRequests:
    """ASGI middleware deciding what reaches the app, before Gradio (and its permissive CORS answers) sees it:

    - 403 for a request from a page of another web origin (its `Origin` is not this server's own address): only the
      app's own page may call it, whatever address it listens on;
    - 421 for a request naming another host while the app listens on a loopback address, as a page of a domain that
      resolves to 127.0.0.1 would (DNS rebinding);
    - 404 for the Gradio routes the apps never use (`REFUSED_ROUTE`).
    Clients without an `Origin` header (scripts, `gradio_client`) are not web pages and pass."""

    def __init__(self, app: Callable, host: str) -> None:
        self.app = app
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        self.host_names = (*LOOPBACK_NAMES, host.lower()) if loopback else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        host = headers.get(b"host", b"").decode("latin-1")
        origin = headers.get(b"origin")
        if self.host_names is not None and _hostname(host) not in self.host_names:
            status, reason = 421, f"this app answers requests to {self.host_names[0]} only"
        elif origin is not None and origin.decode("latin-1").lower() not in (f"http://{host}".lower(),
                                                                             f"https://{host}".lower()):
            status, reason = 403, "requests from other web origins are refused"
        elif REFUSED_ROUTE.fullmatch(scope["path"]):
            status, reason = 404, "not served by hf-ext serve"
        else:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        from starlette.responses import PlainTextResponse

        return await PlainTextResponse(reason, status_code=status)(scope, receive, send)


class RequestSizeLimit:
    """ASGI middleware refusing a request body over `max_bytes` with 413 when its Content-Length announces it, and
    ending one that grows past it while it streams (read as the client leaving)."""

    def __init__(self, app: Callable, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            from starlette.responses import PlainTextResponse

            response = PlainTextResponse(f"request body over {self.max_bytes} bytes", status_code=413)
            return await response(scope, receive, send)
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            return {"type": "http.disconnect"} if received > self.max_bytes else message

        return await self.app(scope, bounded_receive, send)


def user_errors(function: Callable) -> Callable:
    """`function` answering every failure as one message in the page (`gr.Error`), never a traceback: bad input
    (`HfExtError`, `ValueError`) as it is, anything else with its type; the traceback goes to the server's log. The
    message is escaped: the page reads it as HTML, and it may quote the input."""
    import gradio as gr

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except gr.Error:
            raise
        except (HfExtError, ValueError) as error:
            raise gr.Error(html.escape(one_line(error), quote=False), print_exception=False) from None
        except Exception as error:  # noqa: BLE001 - the page gets one line, the log the traceback
            logger.exception("%s failed", function.__name__)
            message = f"{type(error).__name__}: {one_line(error)}"
            raise gr.Error(html.escape(message, quote=False), print_exception=False) from None

    return wrapper


def checked_text(text: str | None, what: str, required: bool = True) -> str:
    """`text` stripped, refused when empty (if `required`) or longer than `MAX_TEXT_CHARS`; `what` names the field
    in the message."""
    text = (text or "").strip()
    if required and not text:
        raise HfExtError(f"{what} is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise HfExtError(f"{what} has {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    return text


def checked_int(value: float | int | None, what: str, low: int, high: int) -> int:
    """`value` as an integer in [low, high] (a slider or number box sends floats), refused otherwise."""
    if value is None or not math.isfinite(value) or value != int(value) or not low <= int(value) <= high:
        raise HfExtError(f"{what} must be an integer in [{low}, {high}], got {value}")
    return int(value)


def checked_float(value: float | int | None, what: str, low: float, high: float) -> float:
    """`value` as a float in [low, high], refused otherwise (NaN included)."""
    if value is None or not math.isfinite(value) or not low <= float(value) <= high:
        raise HfExtError(f"{what} must be in [{low:g}, {high:g}], got {value}")
    return float(value)


def _run_serve(args: argparse.Namespace) -> None:
    model_kwargs = model_loading_settings(args)
    with private_gradio_cache():
        app = build_app(args.model, args.trust_remote_code,
                        before_loading=functools.partial(check_port_free, args.host, args.port),
                        model_kwargs=model_kwargs)
        url = launch(app, args.host, args.port)
        if args.host not in LOOPBACK_NAMES:
            logger.warning(f"listening on {args.host}: anyone who can reach this machine can use the app")
        print(f"hf-ext serve: {args.model} on {url} (API names: {url}?view=api); Ctrl-C stops it", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            print("hf-ext serve: stopped", flush=True)
        finally:
            app.close()


__all__ = ["MAX_REQUEST_BYTES", "MAX_TEXT_CHARS", "ServedRequests", "add_serve_command", "app_module",
           "apps", "build_app", "check_port_free", "checked_float", "checked_int", "checked_text", "launch",
           "private_gradio_cache", "require_gradio", "user_errors"]
