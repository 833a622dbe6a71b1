"""`hf-ext serve`, the shared part: finding the app by model type through MODELS, the one-line refusals (no gradio,
no model, a model type without an app), the limits on requests, nothing sent off the machine, and the command run
for real until Ctrl-C."""

import json
import os
import signal
import subprocess
import sys

import pytest
from conftest import PROCESS_TIMEOUT, REPO_ROOT, cli_exit_code, free_port, local_client, require_extra, running_app

from hf_ext import serve
from hf_ext.cli import build_parser
from hf_ext.errors import HfExtError
from hf_ext.extras import install_command
from hf_ext.models import MODELS

SERVED = [entry for entry in MODELS if entry.app is not None]  # the models whose entry names an app
NOT_SERVED = [entry.model_type for entry in MODELS if entry.app is None]
# how long a request to a served app may take: a first page load renders the page, seconds on a loaded machine,
# beyond httpx's default 5 s
HTTP_TIMEOUT = 120


def test_the_apps_are_found_by_model_type():
    found = serve.apps()
    assert SERVED
    assert {model_type: module.__name__ for model_type, module in found.items()} == {
        entry.model_type: f"{entry.package}.{entry.app}" for entry in SERVED}
    assert all(callable(module.build_app) for module in found.values())
    serve_command = next(action for action in build_parser()._actions if action.dest == "command").choices["serve"]
    assert all(entry.app_summary in serve_command.description for entry in SERVED)  # the help says what each shows


def test_serve_without_gradio_is_one_line(mtdnn_sample_folder, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # what `import gradio` meets when it is not installed
    assert cli_exit_code(["serve", mtdnn_sample_folder]) == 1
    assert capsys.readouterr().err == f"hf-ext: error: hf-ext serve needs the app extra: {install_command('app')}\n"


def test_a_folder_without_a_model_is_one_line(tmp_path, capsys):
    assert cli_exit_code(["serve", tmp_path]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"hf-ext: error: cannot load a model config from {tmp_path}: ") and err.count("\n") == 1


@pytest.mark.parametrize("model_type", [*NOT_SERVED, "bert"])
def test_a_model_type_without_an_app_is_one_line(tmp_path, capsys, monkeypatch, model_type):
    from transformers import AutoConfig

    monkeypatch.setitem(sys.modules, "gradio", None)  # the apps are found without gradio

    AutoConfig.for_model(model_type, vocab_size=10, hidden_size=8, num_hidden_layers=1,
                         num_attention_heads=2).save_pretrained(tmp_path)
    assert cli_exit_code(["serve", tmp_path]) == 1
    served = ", ".join(sorted(entry.model_type for entry in SERVED))
    assert capsys.readouterr().err == (f"hf-ext: error: no app for model type '{model_type}' (hf-ext serve has apps "
                                       f"for {served})\n")


def test_a_port_in_use_is_refused_before_the_model_loads(mtdnn_sample_folder, monkeypatch, capsys):
    import socket

    model_type = json.loads((mtdnn_sample_folder / "config.json").read_text())["model_type"]
    loaded = []
    monkeypatch.setattr(serve, "require_gradio", lambda: None)  # the check comes first: no gradio needed here
    monkeypatch.setattr(serve.apps()[model_type], "build_app", lambda *args, **kwargs: loaded.append(args))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli_exit_code(["serve", mtdnn_sample_folder, "--host", "127.0.0.1", "--port", str(port)]) == 1
    assert capsys.readouterr().err == f"hf-ext: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert loaded == []
    serve.check_port_free("127.0.0.1", port)  # closed, the port is free again


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_a_bad_port_is_a_usage_error(mtdnn_sample_folder, capsys, port):
    assert cli_exit_code(["serve", mtdnn_sample_folder, "--port", port]) == 2
    assert "argument --port" in capsys.readouterr().err


def test_numbers_out_of_range_and_nan_are_refused():
    assert serve.checked_int(3.0, "steps", 2, 16) == 3
    assert serve.checked_float(0.5, "t", 0, 1) == 0.5
    for check, value in ((serve.checked_int, float("nan")), (serve.checked_int, 17), (serve.checked_int, 2.5),
                         (serve.checked_float, float("nan")), (serve.checked_float, -0.1), (serve.checked_int, None)):
        with pytest.raises(HfExtError, match="must be"):
            check(value, "x", 2 if check is serve.checked_int else 0, 16 if check is serve.checked_int else 1)


@pytest.mark.slow
def test_failures_become_one_escaped_message():
    require_extra("app", "gradio")
    import gradio as gr

    def refuse(text):
        raise HfExtError(f"cannot tokenize {text!r}")

    def crash():
        raise KeyError("oops")

    with pytest.raises(gr.Error) as error:
        serve.user_errors(refuse)("<b>x</b>")
    assert error.value.message == "cannot tokenize '&lt;b&gt;x&lt;/b&gt;'"
    with pytest.raises(gr.Error) as error:
        serve.user_errors(crash)()
    assert error.value.message == "KeyError: 'oops'"


@pytest.fixture
def local_network_only(monkeypatch):
    """Record (and refuse) every connection or name lookup that is not for this machine's loopback addresses."""
    import ipaddress
    import socket

    attempts = []
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def local(host):
        try:
            return str(host) in ("localhost", "None") or ipaddress.ip_address(str(host)).is_loopback
        except ValueError:
            return False

    def checked_lookup(host, *args, **kwargs):
        if not local(host):
            attempts.append(host)
            raise OSError("no network in this test")
        return lookup(host, *args, **kwargs)

    def checked_connect(sock, address):
        if isinstance(address, tuple) and not local(address[0]):
            attempts.append(address)
            raise OSError("no network in this test")
        return connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", checked_lookup)
    monkeypatch.setattr(socket.socket, "connect", checked_connect)
    return attempts


@pytest.mark.slow
def test_the_app_reaches_nothing_but_its_own_address(mtdnn_sample_folder, local_network_only):
    """The server's side only: gradio_client itself asks the Hub for request headers unless HF_HUB_OFFLINE=1, so
    the call goes through Gradio's REST API here."""
    import json

    require_extra("app", "gradio")
    import httpx  # gradio's own HTTP client

    with running_app(mtdnn_sample_folder) as url:
        assert url.startswith("http://127.0.0.1:")
        page = httpx.get(url, timeout=HTTP_TIMEOUT)
        assert page.status_code == 200 and "MT-DNN" in page.text
        call = httpx.post(f"{url}gradio_api/call/predict", json={"data": ["a man .", ""]},
                          timeout=HTTP_TIMEOUT).json()
        events = httpx.get(f"{url}gradio_api/call/predict/{call['event_id']}", timeout=HTTP_TIMEOUT).text.splitlines()
        assert events[0] == "event: complete"
        assert set(json.loads(events[1].removeprefix("data: "))[0]) == {"sst", "nli", "sts"}
        too_big = httpx.post(f"{url}gradio_api/call/predict", content=b"x" * (serve.MAX_REQUEST_BYTES + 1),
                             headers={"content-type": "application/json"}, timeout=HTTP_TIMEOUT)
        assert too_big.status_code == 413
    assert local_network_only == []


TOKEN = "hf_" + "Ab1" * 11 + "Z"  # shaped like a Hub token


@pytest.mark.slow
def test_the_app_serves_no_upload_url_fetch_run_history_or_other_origin(mtdnn_sample_folder, local_network_only,
                                                                       monkeypatch):
    """What `hf-ext serve` exposes besides the app's functions: nothing. On 127.0.0.2, an address Gradio does not
    take for a local one, so that it answers every web origin, as on --host 0.0.0.0; the serving user's token is in
    HF_TOKEN, where Gradio's run history would find it."""
    require_extra("app", "gradio")
    import httpx

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with running_app(mtdnn_sample_folder, host="127.0.0.2") as url, httpx.Client(timeout=HTTP_TIMEOUT) as http:
        origin = url.rstrip("/")
        refused = {
            "run history": http.get(f"{url}gradio_api/runs"),
            "run history buckets (with the token)": http.get(f"{url}gradio_api/run-history/buckets"),
            "upload": http.post(f"{url}gradio_api/upload", files={"files": ("a.txt", b"kept after the app stops")}),
            "URL fetched for the client": http.get(f"{url}gradio_api/file=http://example.com/x"),
            "proxied URL": http.get(f"{url}gradio_api/proxy=http://example.com/x"),
        }
        assert {name: response.status_code for name, response in refused.items()} == dict.fromkeys(refused, 404)
        other_origin = http.post(f"{url}gradio_api/call/predict", json={"data": ["a man .", ""]},
                                 headers={"Origin": "http://evil.example"})
        assert (other_origin.status_code, other_origin.text) == (403, "requests from other web origins are refused")
        rebound = http.get(url, headers={"Host": f"evil.example:{url.split(':')[-1]}"})  # DNS rebinding
        assert rebound.status_code == 421
        own_origin = http.post(f"{url}gradio_api/call/predict", json={"data": ["a man .", ""]},
                               headers={"Origin": origin})
        assert own_origin.status_code == 200 and own_origin.headers.get("access-control-allow-origin") in (None,
                                                                                                           origin)
        page, config = http.get(url), http.get(f"{url}config")
        assert page.status_code == config.status_code == 200
        assert "MT-DNN: model" in page.text  # the folder's name
        for response in (*refused.values(), other_origin, rebound, own_origin, page, config):
            assert TOKEN not in response.text and str(mtdnn_sample_folder) not in response.text
    assert local_network_only == []


@pytest.mark.slow
def test_a_port_in_use_is_one_line(mtdnn_sample_folder):
    import socket

    require_extra("app", "gradio")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = serve.build_app(str(mtdnn_sample_folder))
        with pytest.raises(HfExtError, match=f"^cannot listen on 127.0.0.1:{port}: "):
            serve.launch(app, "127.0.0.1", port)


@pytest.mark.slow
def test_the_command_serves_a_hub_id_offline_until_ctrl_c(mtdnn_sample_folder, tmp_path):
    from hf_ext.hub import install_into_hub_cache

    require_extra("app", "gradio")
    install_into_hub_cache(mtdnn_sample_folder, "some-org/mtdnn-tiny", tmp_path / "home" / "hub")
    port = free_port()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGINGFACE_"))}
    (tmp_path / "tmp").mkdir()
    env.update(PYTHONPATH=str(REPO_ROOT), HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1",
               HF_ENDPOINT="http://127.0.0.1:9", OMP_NUM_THREADS="1",  # nothing listens at the endpoint
               TMPDIR=str(tmp_path / "tmp"))  # where Gradio keeps its files unless told otherwise
    server = subprocess.Popen([sys.executable, "-m", "hf_ext.cli", "serve", "some-org/mtdnn-tiny", "--port",
                               str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first_line = server.stdout.readline()
        url = f"http://127.0.0.1:{port}/"
        assert first_line.startswith(f"hf-ext serve: some-org/mtdnn-tiny on {url} "), server.stderr.read()
        predictions = local_client(url).predict("a man .", "a woman .", api_name="/predict")
        assert set(predictions) == {"sst", "nli", "sts"}
        import httpx

        upload = httpx.post(f"{url}gradio_api/upload", files={"files": ("a.txt", b"kept after the app stops")},
                            timeout=HTTP_TIMEOUT)
        assert upload.status_code == 404
        assert "some-org/mtdnn-tiny" in httpx.get(url, timeout=HTTP_TIMEOUT).text
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=PROCESS_TIMEOUT)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, err
    assert "hf-ext serve: stopped" in out.splitlines()
    assert list((tmp_path / "tmp").iterdir()) == []  # no cache left behind
