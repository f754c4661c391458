"""The command line: every option lands in the right Config field; errors exit like uvicorn."""

from __future__ import annotations

import subprocess
import sys

import pytest
from ferroloop.server.cli import parse_args
from ferroloop.server.config import Config
from ferroloop.server.logging_config import LOGGING_CONFIG


def test_defaults():
    options = parse_args(["main:app"])
    assert options is not None
    assert options.pop("app") == "main:app"
    config = Config("main:app", **{**options, "log_config": None})
    assert (config.host, config.port, config.backlog) == ("127.0.0.1", 8000, 2048)
    assert options["app_dir"] == ""
    assert options["proxy_headers"] is True and options["access_log"] is True
    assert options["server_header"] is True and options["date_header"] is True
    assert options["app_task"] == "native"
    assert options["lifespan"] == "auto" and options["workers"] is None
    assert options["timeout_header"] == 10.0 and options["limit_header_size"] == 65536
    assert options["limit_headers"] == 100 and options["limit_uri"] == 8192
    assert options["limit_body"] is None and options["reuse_port"] is False
    assert options["dispatch"] == "front" and options["lane_bulk_body"] == 1024 * 1024
    assert options["lane_fast_workers"] == 1
    assert options["use_colors"] is None and options["log_level"] is None
    assert options["log_config"] is LOGGING_CONFIG  # not None, which would mean "leave alone"


def test_every_option():
    argv = [
        "pkg.mod:make_app",
        "--host", "0.0.0.0",
        "--port", "9001",
        "--uds", "/tmp/x.sock",
        "--fd", "3",
        "--workers", "4",
        "--factory",
        "--app-dir", "src",
        "--root-path", "/api",
        "--no-proxy-headers",
        "--forwarded-allow-ips", "10.0.0.0/8,*",
        "--log-level", "debug",
        "--log-config", "log.json",
        "--no-use-colors",
        "--no-access-log",
        "--limit-concurrency", "100",
        "--max-requests", "1000",
        "--max-requests-jitter", "50",
        "--backlog", "128",
        "--timeout-keep-alive", "2.5",
        "--timeout-graceful-shutdown", "30",
        "--lifespan", "on",
        "--interface", "asgi2",
        "--env-file", ".env",
        "--reload",
        "--reload-dir", "a",
        "--reload-dir", "b",
        "--reload-include", "*.html",
        "--reload-exclude", "tmp*",
        "--reload-delay", "1",
        "--no-server-header",
        "--no-date-header",
        "--reuse-port",
        "--dispatch", "kernel",
        "--lane-bulk-body", "65536",
        "--lane-fast-workers", "2",
        "--metrics",
        "--metrics-address", "0.0.0.0",
        "--metrics-port", "9300",
        "--timeout-header", "3",
        "--limit-header-size", "8192",
        "--limit-headers", "50",
        "--limit-uri", "2048",
        "--limit-body", "1048576",
        "--app-task", "asyncio",
        "--header", "X-Frame-Options: DENY",
        "--header", "x-team:core:blue",
        "--reset-contextvars",
        "--h11-max-incomplete-event-size", "4096",
        "--timeout-worker-healthcheck", "2.5",
        "--ws", "wsproto",
        "--ws-max-size", "1024",
        "--ws-max-queue", "4",
        "--ws-ping-interval", "5",
        "--ws-ping-timeout", "0",
        "--no-ws-per-message-deflate",
        "--wsgi-threads", "3",
        "--ssl-keyfile", "k.pem",
        "--ssl-certfile", "c.pem",
        "--ssl-keyfile-password", "secret",
        "--ssl-version", "5",
        "--ssl-cert-reqs", "2",
        "--ssl-ca-certs", "ca.pem",
        "--ssl-ciphers", "TLSv1",
    ]  # fmt: skip
    options = parse_args(argv)
    assert options == {
        "app": "pkg.mod:make_app",
        "host": "0.0.0.0",
        "port": 9001,
        "uds": "/tmp/x.sock",
        "fd": 3,
        "workers": 4,
        "factory": True,
        "app_dir": "src",
        "root_path": "/api",
        "proxy_headers": False,
        "forwarded_allow_ips": "10.0.0.0/8,*",
        "log_level": "debug",
        "log_config": "log.json",
        "use_colors": False,
        "access_log": False,
        "limit_concurrency": 100,
        "limit_max_requests": 1000,
        "max_requests_jitter": 50,
        "backlog": 128,
        "timeout_keep_alive": 2.5,
        "timeout_graceful_shutdown": 30.0,
        "lifespan": "on",
        "interface": "asgi2",
        "env_file": ".env",
        "reload": True,
        "reload_dirs": ["a", "b"],
        "reload_includes": ["*.html"],
        "reload_excludes": ["tmp*"],
        "reload_delay": 1.0,
        "server_header": False,
        "date_header": False,
        "reuse_port": True,
        "dispatch": "kernel",
        "lane_bulk_body": 65536,
        "lane_fast_workers": 2,
        "metrics": True,
        "metrics_address": "0.0.0.0",
        "metrics_port": 9300,
        "timeout_header": 3.0,
        "limit_header_size": 8192,
        "limit_headers": 50,
        "limit_uri": 2048,
        "limit_body": 1048576,
        "app_task": "asyncio",
        "headers": [("X-Frame-Options", "DENY"), ("x-team", "core:blue")],
        "reset_contextvars": True,
        "h11_max_incomplete_event_size": 4096,
        "timeout_worker_healthcheck": 2.5,
        "loop": None,
        "http": None,
        "ws": "wsproto",
        "ws_max_size": 1024,
        "ws_max_queue": 4,
        "ws_ping_interval": 5.0,
        "ws_ping_timeout": 0.0,
        "ws_per_message_deflate": False,
        "wsgi_threads": 3,
        "ssl_keyfile": "k.pem",
        "ssl_certfile": "c.pem",
        "ssl_keyfile_password": "secret",
        "ssl_version": 5,
        "ssl_cert_reqs": 2,
        "ssl_ca_certs": "ca.pem",
        "ssl_ciphers": "TLSv1",
    }


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], True),
        (["--ws-per-message-deflate"], True),
        (["--no-ws-per-message-deflate"], False),
        (["--ws-per-message-deflate", "false"], False),
        (["--ws-per-message-deflate", "False"], False),
        (["--ws-per-message-deflate", "0"], False),
        (["--ws-per-message-deflate", "true"], True),
    ],
)
def test_ws_per_message_deflate_takes_uvicorns_boolean_value(argv, expected):
    options = parse_args(["m:a", *argv])
    assert options is not None
    assert options["ws_per_message_deflate"] is expected


def test_ws_per_message_deflate_refuses_a_value_that_is_not_a_boolean(capsys):
    with pytest.raises(SystemExit):
        parse_args(["m:a", "--ws-per-message-deflate", "maybe"])
    assert "expected true or false" in capsys.readouterr().err


def test_uvicorn_spellings():
    options = parse_args(
        ["m:a", "--limit-max-requests", "5", "--limit-max-requests-jitter", "2", "--proxy-headers"]
    )
    assert options is not None
    assert options["limit_max_requests"] == 5 and options["max_requests_jitter"] == 2
    assert options["proxy_headers"] is True
    options = parse_args(["m:a", "--loop", "uvloop", "--http", "httptools", "--ws", "none"])
    assert options is not None and options["loop"] == "uvloop"


def test_options_are_exactly_config_parameters():
    import inspect

    options = parse_args(["m:a"])
    assert options is not None
    parameters = set(inspect.signature(Config).parameters)
    assert set(options) <= parameters


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["m:a", "--log-level", "loud"],
        ["m:a", "--lifespan", "maybe"],
        ["m:a", "--port", "x"],
        ["m:a", "--header", "no-colon"],
        ["m:a", "--header", ":value-without-name"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert "usage: ferroloop" in capsys.readouterr().err


def test_version(capsys):
    assert parse_args(["--version"]) is None
    assert capsys.readouterr().out.startswith("Running ferroloop ")


def run_cli(*args: str, cwd=None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ferroloop", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
    )


def test_module_not_found_exits_3_with_uvicorns_message(tmp_path):
    result = run_cli("ferroloop_no_such_module:app", cwd=tmp_path)
    assert result.returncode == 3
    assert 'Error loading ASGI app. Could not import module "ferroloop_no_such_module".' in (
        result.stderr
    )


def test_bad_import_string_exits_3(tmp_path):
    result = run_cli("no_colon", cwd=tmp_path)
    assert result.returncode == 3
    assert 'Import string "no_colon" must be in format "<module>:<attribute>".' in result.stderr


def test_missing_attribute_found_through_app_dir(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ferroloop_cli_mod.py").write_text("x = 1\n")
    result = run_cli("ferroloop_cli_mod:app", "--app-dir", "src", cwd=tmp_path)
    assert result.returncode == 3
    assert 'Attribute "app" not found in module "ferroloop_cli_mod".' in result.stderr


def test_bad_option_value_exits_2(tmp_path):
    result = run_cli("m:app", "--backlog", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert "backlog must be more than zero" in result.stderr


def test_workers_need_an_import_string():
    from ferroloop.server.config import STARTUP_FAILURE
    from ferroloop.server.serve import run_config

    async def app(scope, receive, send):
        pass

    assert run_config(Config(app, workers=2, log_config=None)) == STARTUP_FAILURE


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ssl_keyfile": "k.pem"}, "ssl_keyfile needs ssl_certfile"),
        ({"ssl_certfile": "c.pem", "ssl_version": 3}, "ssl_version 3 is not supported"),
        ({"ssl_certfile": "c.pem", "ssl_cert_reqs": 7}, "ssl_cert_reqs must be 0"),
        ({"ssl_certfile": "c.pem", "ssl_cert_reqs": 2}, "give ssl_ca_certs too"),
        ({"ssl_certfile": "c.pem", "ssl_ciphers": "ECDHE+AESGCM"}, "is not supported"),
    ],
)
def test_tls_options_the_server_cannot_honour_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        Config("m:a", **options)


def test_tls_settings_reach_the_native_server_as_pem_bytes(tmp_path):
    trustme = pytest.importorskip("trustme")
    cert = trustme.CA().issue_cert("127.0.0.1")
    certfile, keyfile = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    cert.private_key_pem.write_to_path(str(keyfile))
    config = Config("m:a", ssl_certfile=str(certfile), ssl_keyfile=str(keyfile), ssl_version=5)
    assert config.is_ssl
    config.load_tls()
    options = config.http_server_options()
    assert options["scheme"] == "https"
    assert options["tls_cert"] == certfile.read_bytes()
    assert options["tls_key"] == keyfile.read_bytes()
    assert options["tls_client_ca"] is None
    assert options["tls_versions"] == ["1.2"]
    assert options["tls_client_auth"] == 0
    plain = Config("m:a").http_server_options()
    assert plain["scheme"] == "http" and "tls_cert" not in plain


def test_an_encrypted_key_is_decrypted_with_its_password(tmp_path):
    trustme = pytest.importorskip("trustme")
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    cert = trustme.CA().issue_cert("127.0.0.1")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"s3cret"),
    )
    certfile, keyfile = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.cert_chain_pems[0].write_to_path(str(certfile))
    keyfile.write_bytes(encrypted)
    config = Config(
        "m:a", ssl_certfile=str(certfile), ssl_keyfile=str(keyfile), ssl_keyfile_password="s3cret"
    )
    config.load_tls()
    assert config.tls_material is not None
    plain_key = config.tls_material["tls_key"]
    assert b"ENCRYPTED" not in plain_key
    assert serialization.load_pem_private_key(plain_key, None).public_key().public_numbers() == (
        key.public_key().public_numbers()
    )
    wrong = Config(
        "m:a", ssl_certfile=str(certfile), ssl_keyfile=str(keyfile), ssl_keyfile_password="nope"
    )
    with pytest.raises(SystemExit) as exited:
        wrong.load_tls()
    assert exited.value.code == 3
