"""What the server commands share: their common options, and running until a signal.

``highwater controller`` and ``highwater observer`` (and the broker and coordinator
commands after them) run one long-lived server on uvloop — libuv's event loop costs less
per gRPC message than asyncio's own — until SIGTERM or SIGINT asks for a graceful stop or
the server stops by itself after a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click
import uvloop

from highwater.cli.addresses import parse_addresses
from highwater.config.server import ServerConfig, load_server_config, read_properties
from highwater.errors import HighwaterError, InvalidConfigError
from highwater.etcd_metadata.endpoints import (
    EtcdStoreAddress,
    parse_metadata_store,
    with_client_tls,
)
from highwater.rpc.auth import ServerSecurity
from highwater.rpc.auth import configure as configure_auth
from highwater.rpc.client_auth import client_security_from_properties, configure_client_sasl
from highwater.rpc.endpoints import parse_endpoint, parse_quorum_voters
from highwater.rpc.tls import (
    ClientAuth,
    ClientTls,
    ServerTls,
    TlsConfigError,
    configure,
)
from highwater.security.authentication import AuthenticationSettings
from highwater.security.oauthbearer import JwtValidator
from highwater.telemetry.configure import (
    MetricsTls,
    TelemetryConfigError,
    configure_telemetry,
    parse_listen,
)

F = TypeVar("F", bound=Callable[..., Any])

SNAPSHOT_BYTES_OPTION = "--metadata-log-max-record-bytes-between-snapshots"


class Server(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def wait_stopped(self) -> None: ...

    @property
    def failure(self) -> BaseException | None: ...


def _voters(_ctx: click.Context, _param: click.Parameter, value: str) -> dict[int, str]:
    try:
        return parse_quorum_voters(value)
    except ValueError as e:
        raise click.BadParameter(f"{e} (expected ID@HOST:PORT,ID@HOST:PORT,...)") from None


def _listen(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parse_endpoint(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value


def _cluster_id(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.strip():
        raise click.BadParameter("must not be empty")
    return value


def listen_option(*, required: bool, default: str | None = None, help: str) -> Callable[[F], F]:
    return click.option(
        "--listen",
        required=required,
        default=default,
        show_default=default is not None,
        callback=_listen,
        metavar="HOST:PORT",
        help=help,
    )


def optional_address(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """A click callback for an optional HOST:PORT option (an advertised address): checked
    when given, a usage error naming the option when malformed."""
    if value is not None:
        try:
            parse_endpoint(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


def _kafka_listener(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        # Imported here, as each Kafka-protocol import: only processes serving it load it.
        from highwater.broker.kafka_protocol.sasl import parse_kafka_listener

        try:
            parse_kafka_listener(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


def kafka_listener_options(function: F) -> F:
    """``--kafka-listen`` and ``--kafka-advertised-listener``: Kafka's binary protocol on a
    port of its own (docs/kafka-protocol.md); off unless asked."""
    function = click.option(
        "--kafka-advertised-listener",
        default=None,
        callback=_kafka_listener,
        metavar="HOST:PORT",
        help="Where Kafka clients are told to connect, if not --kafka-listen (a proxy, a NAT).",
    )(function)
    return click.option(
        "--kafka-listen",
        default=None,
        callback=_kafka_listener,
        metavar="[PROTOCOL://]HOST:PORT",
        help="Serve Kafka's wire protocol here too, for Kafka clients (off unless given); "
        "PROTOCOL is the listener's security protocol: PLAINTEXT (the default), SSL, "
        "SASL_PLAINTEXT or SASL_SSL (with the --tls-* files and --sasl-enabled-mechanisms).",
    )(function)


def check_kafka_listener(kafka_listen: str | None) -> None:
    """A usage error if ``--kafka-listen``'s security protocol cannot work with the
    process's security settings (TLS files, SASL mechanisms), before anything is bound."""
    if kafka_listen is None:
        return
    from highwater.broker.kafka_protocol.door import kafka_listener_security

    try:
        kafka_listener_security(kafka_listen)
    except InvalidConfigError as e:
        raise click.UsageError(str(e)) from None


def _controllers(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str]:
    return parse_addresses(value) if value is not None else []


def controllers_option(function: F) -> F:
    """``--controllers HOST:PORT,...``: where a broker or coordinator finds the quorum
    (or, instead, ``--metadata-store``: :func:`metadata_store_option`)."""
    return click.option(
        "--controllers",
        default=None,
        callback=_controllers,
        metavar="HOST:PORT,...",
        help="Controllers of the quorum (any of them; the rest are learned from it). "
        "Required unless --metadata-store is given.",
    )(function)


def etcd_store_option(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> EtcdStoreAddress | None:
    """A click callback: an ``etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]`` option parsed, or
    a usage error naming what is wrong with it."""
    if value is None:
        return None
    try:
        return parse_metadata_store(value)
    except HighwaterError as e:
        raise click.BadParameter(str(e)) from None


def metadata_store_option(function: F) -> F:
    """``--metadata-store etcd://HOST:PORT,...[/CLUSTER]``: the etcd metadata mode (with
    TLS to etcd: ``https://...`` and :func:`etcd_tls_options`)."""
    return click.option(
        "--metadata-store",
        default=None,
        callback=etcd_store_option,
        metavar="etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]",
        help="Keep the metadata in etcd (the ZooKeeper-era layout, docs/etcd-mode.md) "
        "instead of a controller quorum: replaces --controllers. https://... for TLS to "
        "etcd (--etcd-ca-file...).",
    )(function)


def etcd_tls_options(store_parameter: str) -> Callable[[F], F]:
    """``--etcd-ca-file``, ``--etcd-cert-file``, ``--etcd-key-file``: TLS to the etcd of
    the command's ``store_parameter`` option (``metadata_store``, ``migration_from``),
    which must then be ``https://``. The files are read before the command runs (a missing
    or unreadable one is a usage error naming it), and the address the command gets
    carries them, so every connection to etcd the process makes uses them."""

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def command(
            *args: Any,
            etcd_ca_file: Path | None,
            etcd_cert_file: Path | None,
            etcd_key_file: Path | None,
            **kwargs: Any,
        ) -> Any:
            store = kwargs.get(store_parameter)
            if store is None:
                if etcd_ca_file or etcd_cert_file or etcd_key_file:
                    raise click.UsageError(
                        "--etcd-ca-file, --etcd-cert-file and --etcd-key-file go with "
                        f"--{store_parameter.replace('_', '-')}"
                    )
            else:
                try:
                    kwargs[store_parameter] = with_client_tls(
                        store,
                        ca_file=etcd_ca_file,
                        cert_file=etcd_cert_file,
                        key_file=etcd_key_file,
                    )
                except HighwaterError as e:
                    raise click.UsageError(str(e)) from None
            return function(*args, **kwargs)

        path = click.Path(dir_okay=False, path_type=Path)
        options = [
            click.option(
                "--etcd-ca-file",
                type=path,
                default=None,
                help="The CA certificates (PEM) that signed etcd's server certificate "
                "(etcdctl's --cacert); default: the system's.",
            ),
            click.option(
                "--etcd-cert-file",
                type=path,
                default=None,
                help="A client certificate (PEM) for etcd's --client-cert-auth (etcdctl's "
                "--cert): mutual TLS. Needs --etcd-key-file.",
            ),
            click.option(
                "--etcd-key-file",
                type=path,
                default=None,
                help="The client certificate's private key (PEM; etcdctl's --key).",
            ),
        ]
        for option in reversed(options):
            command = option(command)
        return command  # type: ignore[return-value]

    return decorate


def require_one_metadata_source(
    controllers: list[str], metadata_store: EtcdStoreAddress | None
) -> None:
    """A usage error unless exactly one of ``--controllers`` and ``--metadata-store``."""
    if bool(controllers) == (metadata_store is not None):
        raise click.UsageError("give either --controllers or --metadata-store (one of them)")


def metadata_replica_options(function: F) -> F:
    """``--node-id``, ``--voters``, ``--data-dir``, ``--cluster-id`` and the snapshot
    interval: what every replica of the metadata log is started with."""
    return _replica_options(function, voters_required=True)


def controller_replica_options(function: F) -> F:
    """:func:`metadata_replica_options` with ``--voters`` optional: a controller may be
    given its dynamic quorum instead (``--initial-controllers``, ``--bootstrap-controllers``)."""
    return _replica_options(function, voters_required=False)


def _voters_or_none(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> dict[int, str] | None:
    return None if value is None else _voters(ctx, param, value)


def _replica_options(function: F, *, voters_required: bool) -> F:
    options = [
        click.option("--node-id", type=click.IntRange(min=0, max=2**31 - 1), required=True),
        click.option(
            "--voters",
            required=voters_required,
            callback=_voters if voters_required else _voters_or_none,
            metavar="ID@HOST:PORT,...",
            help="The quorum's voters (Kafka's controller.quorum.voters)"
            + ("." if voters_required else ": a static quorum, fixed for good."),
        ),
        click.option(
            "--data-dir",
            type=click.Path(file_okay=False, path_type=Path),
            required=True,
            help="Where the metadata log, its snapshots and quorum-state live.",
        ),
        click.option(
            "--cluster-id",
            default=None,
            callback=_cluster_id,
            help="The cluster's id; by default the one stored in --data-dir, else one "
            "derived from --voters (the same on every replica).",
        ),
        click.option(
            SNAPSHOT_BYTES_OPTION,
            "snapshot_bytes",
            type=click.IntRange(min=1),
            default=20 * 1024 * 1024,
            show_default=True,
            metavar="BYTES",
            help="Write a snapshot of the metadata image after this many bytes of "
            "committed log (Kafka's setting of the same name).",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def start_telemetry(
    ctx: click.Context, metrics_listen: str | None = None, metrics_tls: bool = False
) -> None:
    """Set up OpenTelemetry for this command's process (see :mod:`highwater.telemetry`) as
    ``highwater-<command>``, shut down when the command ends. ``metrics_tls``: serve the
    metrics over HTTPS with the command's ``--tls-*`` files."""
    https = _metrics_tls(ctx, metrics_listen) if metrics_tls else None
    try:
        telemetry = configure_telemetry(
            f"highwater-{ctx.info_name}", metrics_listen=metrics_listen, metrics_tls=https
        )
    except TelemetryConfigError as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:
        raise click.BadParameter(f"cannot listen on {metrics_listen}: {e}") from None
    ctx.call_on_close(telemetry.shutdown)
    if telemetry.metrics_address is not None:
        host, port = telemetry.metrics_address
        scheme = "https" if https is not None else "http"
        logging.getLogger(__name__).info(
            "Prometheus metrics on %s://%s:%d/metrics", scheme, host, port
        )


def _metrics_tls(ctx: click.Context, metrics_listen: str | None) -> MetricsTls:
    """The metrics endpoint's TLS: the process's ``--tls-*`` files (its CA file makes
    scrapers present a certificate, unless ``--tls-client-auth none``)."""
    if metrics_listen is None:
        raise click.UsageError("--metrics-tls needs --metrics-listen")
    cert, key = ctx.params.get("tls_cert_file"), ctx.params.get("tls_key_file")
    if cert is None or key is None:
        raise click.UsageError(
            "--metrics-tls serves the process's certificate: give --tls-cert-file and "
            "--tls-key-file"
        )
    ca = ctx.params.get("tls_ca_file")
    if ctx.params.get("tls_client_auth") == ClientAuth.NONE.value:
        ca = None
    return MetricsTls(str(cert), str(key), None if ca is None else str(ca))


def _metrics_listen(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        try:
            parse_listen(value)
        except TelemetryConfigError as e:
            raise click.BadParameter(str(e)) from None
    return value


def telemetry_option(function: F) -> F:
    """``--metrics-listen HOST:PORT`` (serve Prometheus metrics there) for a server
    command; telemetry is set up when the command runs, before it builds its server."""

    @functools.wraps(function)
    def run(*args: Any, metrics_listen: str | None, metrics_tls: bool, **kwargs: Any) -> Any:
        start_telemetry(click.get_current_context(), metrics_listen, metrics_tls)
        return function(*args, **kwargs)

    with_tls = click.option(
        "--metrics-tls",
        is_flag=True,
        help="Serve the metrics over HTTPS with the process's --tls-cert-file and "
        "--tls-key-file; with --tls-ca-file, scrapers must present a certificate it signed.",
    )(run)
    return click.option(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        callback=_metrics_listen,
        help="Serve Prometheus metrics on http://HOST:PORT/metrics. Traces and OTLP "
        "metrics follow the OTEL_* environment variables.",
    )(with_tls)  # type: ignore[return-value]


def tls_options(function: F) -> F:
    """The transport security and authentication flags of a server command, set for the
    process before the command builds its server (docs/security.md):

    - ``--tls-cert-file``, ``--tls-key-file``, ``--tls-ca-file`` and ``--tls-client-auth``:
      TLS on its port and on its channels to the other services (the same certificate both
      ways). Without a certificate everything stays plaintext;
    - ``--authorizer acl|none``, ``--super-users``, ``--allow-everyone-if-no-acl-found``:
      the ACL checks of every call;
    - ``--sasl-enabled-mechanisms``, ``--oauthbearer-jwks-file``, ``--oauthbearer-issuer``,
      ``--oauthbearer-audience``: the ``Authenticate`` call.

    Each security flag stands for a server config key (``authorizer.class.name``,
    ``super.users``, ...), which a ``--config`` file or ``--override`` may set instead; the
    flag, when given, beats it."""

    @functools.wraps(function)
    def run(
        *args: Any,
        tls_cert_file: Path | None,
        tls_key_file: Path | None,
        tls_ca_file: Path | None,
        tls_client_auth: str | None,
        authorizer: str | None,
        super_users: str | None,
        allow_everyone_if_no_acl_found: bool | None,
        sasl_enabled_mechanisms: str | None,
        oauthbearer_jwks_file: Path | None,
        oauthbearer_issuer: str | None,
        oauthbearer_audience: str | None,
        **kwargs: Any,
    ) -> Any:
        configure_tls(tls_cert_file, tls_key_file, tls_ca_file, tls_client_auth)
        flags = {
            "authorizer.class.name": authorizer,
            "super.users": super_users,
            "allow.everyone.if.no.acl.found": (
                None
                if allow_everyone_if_no_acl_found is None
                else str(allow_everyone_if_no_acl_found).lower()
            ),
            "sasl.enabled.mechanisms": sasl_enabled_mechanisms,
            "sasl.oauthbearer.jwks.endpoint.url": (
                oauthbearer_jwks_file.resolve().as_uri() if oauthbearer_jwks_file else None
            ),
            "sasl.oauthbearer.expected.issuer": oauthbearer_issuer,
            "sasl.oauthbearer.expected.audience": oauthbearer_audience,
        }
        configure_security(kwargs.get("config_file"), kwargs.get("overrides", ()), flags)
        return function(*args, **kwargs)

    pem = click.Path(exists=True, dir_okay=False, path_type=Path)
    for option in reversed(
        (
            click.option(
                "--tls-cert-file",
                type=pem,
                default=None,
                help="PEM certificate (chain) this process presents, as server and to peers.",
            ),
            click.option("--tls-key-file", type=pem, default=None, help="Its PEM private key."),
            click.option(
                "--tls-ca-file",
                type=pem,
                default=None,
                help="PEM CA certificates to trust; with it, client certificates are required "
                "unless --tls-client-auth none.",
            ),
            click.option(
                "--tls-client-auth",
                type=click.Choice([a.value for a in ClientAuth]),
                default=None,
                help="Kafka's ssl.client.auth: required (the default with a CA file) or none.",
            ),
            click.option(
                "--authorizer",
                type=click.Choice(["acl", "none"]),
                default=None,
                help="authorizer.class.name: acl checks every call against the ACLs "
                "(default none; --super-users turns it on too).",
            ),
            click.option(
                "--super-users",
                default=None,
                metavar="User:a;User:b",
                help="super.users: principals allowed everything (turns the ACL checks on).",
            ),
            click.option(
                "--allow-everyone-if-no-acl-found/--deny-if-no-acl-found",
                default=None,
                help="allow.everyone.if.no.acl.found: allow a call on a resource no ACL "
                "covers (default: deny).",
            ),
            click.option(
                "--sasl-enabled-mechanisms",
                default=None,
                metavar="M1,M2",
                help="sasl.enabled.mechanisms: SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER "
                "(serves the Authenticate call).",
            ),
            click.option(
                "--oauthbearer-jwks-file",
                type=pem,
                default=None,
                help="The JWKS (JSON) whose keys sign OAUTHBEARER tokens.",
            ),
            click.option(
                "--oauthbearer-issuer", default=None, help="The iss claim tokens must carry."
            ),
            click.option(
                "--oauthbearer-audience", default=None, help="The aud claim tokens must carry."
            ),
        )
    ):
        run = option(run)
    return run  # type: ignore[return-value]


def configure_security(
    config_file: Path | None, overrides: tuple[str, ...], flags: dict[str, str | None]
) -> None:
    """Set the process's authentication and authorization from the server config keys
    and the flags that beat them; a :class:`click.ClickException` naming what cannot work."""
    try:
        config = load_server_config(
            config_file,
            [*overrides, *(f"{key}={value}" for key, value in flags.items() if value is not None)],
        )
        security = server_security_from_config(config)
    except (InvalidConfigError, ValueError) as e:
        # Exit 1 with one "Error: ..." line, as every other refused server setting
        # (docs/configuration.md).
        raise click.ClickException(str(e)) from None
    configure_auth(security)


def server_security_from_config(config: ServerConfig) -> ServerSecurity:
    """The :class:`ServerSecurity` of the server config keys (``ValueError`` if unusable)."""
    mechanisms = AuthenticationSettings.parse_mechanisms(config.get("sasl.enabled.mechanisms"))
    validator = None
    jwks_url = config.get("sasl.oauthbearer.jwks.endpoint.url")
    if jwks_url:
        if not jwks_url.startswith("file://"):
            raise ValueError(
                f"sasl.oauthbearer.jwks.endpoint.url={jwks_url}: only file:// URLs are read"
            )
        issuer = config.get("sasl.oauthbearer.expected.issuer")
        audience = config.get("sasl.oauthbearer.expected.audience")
        if not issuer or not audience:
            raise ValueError("OAUTHBEARER needs --oauthbearer-issuer and --oauthbearer-audience")
        validator = JwtValidator.from_file(
            Path(urllib.parse.unquote(urllib.parse.urlparse(jwks_url).path)),
            issuer=issuer,
            audience=audience,
        )
    return ServerSecurity(
        authentication=AuthenticationSettings(
            enabled_mechanisms=mechanisms,
            jwt_validator=validator,
            max_session_s=config.grpc_session_token_lifetime_ms() / 1000,
            max_reauth_s=config.get("connections.max.reauth.ms") / 1000,
            failed_authentication_delay_ms=config.get("connection.failed.authentication.delay.ms"),
        ),
        authorizer=config.get("authorizer.class.name"),
        super_users=ServerSecurity.parse_super_users(config.get("super.users")),
        allow_everyone_if_no_acl_found=config.get("allow.everyone.if.no.acl.found"),
        principal_mapping_rules=config.get("ssl.principal.mapping.rules"),
    )


SERVER_COMMANDS = frozenset({"server", "controller", "broker", "coordinator", "observer"})
"""The commands that run a role: they take the --tls-* flags, not --command-config."""
LOCAL_COMMANDS = frozenset({"dump-log", "dev-cluster"})
"""The commands that talk to no cluster of the user's: no --command-config."""


def add_command_config(group: click.Group) -> None:
    """Give every client command under ``group`` (recursively) Kafka tools'
    ``--command-config FILE``: a Java-properties file of client security settings
    (``security.protocol``, ``ssl.ca.location``, ``ssl.certificate.location``,
    ``ssl.key.location``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
    ``sasl.oauthbearer.token``, ``sasl.oauthbearer.token.file``) that the command's
    channels use."""
    for name, command in group.commands.items():
        if name in SERVER_COMMANDS or name in LOCAL_COMMANDS:
            continue
        if isinstance(command, click.Group):
            add_command_config(command)
            continue
        if command.callback is None or any(p.name == "command_config" for p in command.params):
            continue
        command.params.append(
            click.Option(
                ["--command-config"],
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                default=None,
                expose_value=False,
                callback=_apply_command_config,
                is_eager=True,
                help="Java-properties file of client security settings, as Kafka's tools "
                "take (security.protocol=SSL|SASL_SSL|SASL_PLAINTEXT, ssl.ca.location, "
                "ssl.certificate.location, ssl.key.location, sasl.mechanism, sasl.username, "
                "sasl.password, sasl.oauthbearer.token[.file]).",
            )
        )


def _apply_command_config(_ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is None:
        return
    try:
        client = client_security_from_properties(read_properties(value))
    except (TlsConfigError, InvalidConfigError) as e:
        raise click.BadParameter(f"{value}: {e}", param_hint="--command-config") from None
    configure(server=None, client=client.tls)
    configure_client_sasl(client.sasl)


def configure_tls(
    cert_file: Path | None,
    key_file: Path | None,
    ca_file: Path | None,
    client_auth: str | None,
) -> None:
    """Set the process's TLS from the flags; a :class:`click.UsageError` naming the flag
    when they cannot work."""
    if cert_file is None and key_file is None:
        if ca_file is not None or client_auth is not None:
            raise click.UsageError("--tls-ca-file and --tls-client-auth need --tls-cert-file")
        configure(server=None, client=None)
        return
    if cert_file is None or key_file is None:
        raise click.UsageError("--tls-cert-file and --tls-key-file go together")
    try:
        server = ServerTls(
            cert_file, key_file, ca_file, ClientAuth(client_auth) if client_auth else None
        )
        client = ClientTls(ca_file, cert_file, key_file)
    except TlsConfigError as e:
        raise click.UsageError(str(e)) from None
    configure(server=server, client=client)


def run_until_signalled(server: Server, what: str) -> None:
    """Start ``server`` and serve until SIGTERM or SIGINT (then stop it gracefully) or
    until it stops by itself; a failure to start or a failure that stopped it is a
    :class:`click.ClickException` naming ``what`` stopped."""
    try:
        failure = uvloop.run(_serve(server))
    except (HighwaterError, OSError) as e:
        raise click.ClickException(str(e)) from None
    if failure is not None:
        raise click.ClickException(f"the {what} stopped: {failure}")


async def _serve(server: Server) -> BaseException | None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # a signal during start-up counts too
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    tasks = [
        asyncio.create_task(stop.wait()),
        asyncio.create_task(server.wait_stopped()),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await server.stop()
    return server.failure
