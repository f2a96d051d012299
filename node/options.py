"""Server options: what the command line and the config file produce, and
what the server consumes. Field names follow nats-server's config keys.

Durations are seconds (float); sizes are bytes (int).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.accountconf import AccountsConfig
    from node.mapping import MappingTable
    from node.resolver import OperatorConfig

DEFAULT_PORT = 4222
DEFAULT_MAX_PAYLOAD = 1024 * 1024
DEFAULT_MAX_CONTROL_LINE = 4096
DEFAULT_MAX_PENDING = 64 * 1024 * 1024
DEFAULT_STORE_DIR = "./jetraft-data"


@dataclass
class Permissions:
    publish_allow: list[str] | None = None
    publish_deny: list[str] | None = None
    subscribe_allow: list[str] | None = None
    subscribe_deny: list[str] | None = None
    allow_responses: bool = False
    # allow_responses {max, expires}: replies per request and how long the grant lasts
    # (nats-server's defaults: 1 and 2 min; <= 0 after parsing: no limit).
    response_max: int = 1
    response_expires: float = 120.0


@dataclass
class User:
    user: str | None = None
    password: str | None = None  # plain text, or a bcrypt hash ("$2a$...")
    nkey: str | None = None  # public user nkey ("U...")
    permissions: Permissions | None = None
    # STANDARD, WEBSOCKET, ...: the connection types this user may log in over (empty: all).
    allowed_connection_types: list[str] = field(default_factory=list)


@dataclass
class TLSOptions:
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    verify: bool = False
    timeout: float = 2.0
    handshake_first: bool = False
    min_version: str | None = None  # "1.2" or "1.3"
    # Hex SHA-256 of client certificates' public keys (SubjectPublicKeyInfo, DER):
    # when set, a client must present one of these keys.
    pinned_certs: list[str] = field(default_factory=list)
    verify_and_map: bool = False  # the client certificate names the user
    cipher_suites: list[str] = field(default_factory=list)  # Go names, TLS 1.2 only


@dataclass
class WebsocketOptions:
    host: str = "0.0.0.0"
    port: int = 0  # 0: disabled
    no_tls: bool = False
    compression: bool = False
    tls: TLSOptions | None = None
    # Browser Origin checks (a request without Origin is not a browser's: allowed).
    same_origin: bool = False
    allowed_origins: list[str] = field(default_factory=list)
    no_auth_user: str | None = None  # for WebSocket clients that send no credentials
    # Seconds to complete the HTTP upgrade (None: websocket.HANDSHAKE_TIMEOUT, 5 s).
    handshake_timeout: float | None = None


@dataclass
class ClusterOptions:
    name: str | None = None
    host: str = "0.0.0.0"
    port: int = 0  # 0: no cluster listener
    routes: list[str] = field(default_factory=list)
    advertise: str | None = None  # host:port other nodes dial (default: the listen address)
    no_advertise: bool = False  # keep this node's client URL out of clients' connect_urls
    # Cluster authorization: what a node must present to join (and presents itself
    # when a route URL carries no credentials).
    user: str | None = None
    password: str | None = None
    token: str | None = None
    auth_timeout: float = 2.0
    tls: TLSOptions | None = None  # mutual TLS between nodes (client certificates required)
    connect_retries: int = 0  # accepted for compatibility: Jetraft redials forever
    # Raft's direct TCP lane (raft/tcp_lane.py), a second listener on `host`: 0 = an
    # ephemeral port (the default), announced to the other members by gossip; N = that
    # port; -1 = none (Raft rides the gRPC cluster port only, as `raft_lane: grpc`). Same
    # authorization and TLS as the cluster port; a member that announces no lane is
    # reached over gRPC.
    raft_port: int = 0
    # Which lane carries Raft: "auto" (the direct lane, gRPC while a peer's lane port
    # cannot be dialed, back to the lane once it can), "direct" (the lane only, redialed
    # until it answers) or "grpc" (no lane: no listener, no lane dialed).
    raft_lane: str = "auto"


@dataclass
class JetStreamOptions:
    enabled: bool = False
    store_dir: str = DEFAULT_STORE_DIR
    max_mem: int = -1
    max_file: int = -1
    sync_interval: str = "always"  # Jetraft always fsyncs before acking
    unique_tag: str | None = None
    # JetStream domain (node/jetstream/domain.py): "" none; else `$JS.<domain>.API.>` is mapped
    # onto `$JS.API.>` in every account, and replies and advisories name it.
    domain: str = ""
    # Encryption at rest (node/jetstream/crypt.py): the master key as configured, and the
    # cipher ("chacha" or "aes"; None: not given, chacha when a key is).
    key: str | None = None
    cipher: str | None = None
    # Key rotation: the key the store was sealed under before `key` (prev_key, prev_ek,
    # prev_encryption_key); tried when `key` does not open the store's key file.
    prev_key: str | None = None
    # Audit retention (jetraft's own key): compaction moves obsolete WAL segments into
    # <store_dir>/raft/wal/archive instead of deleting them, for `jetraft audit`.
    audit_archive: bool = False
    # `strict: false`: unknown fields in API requests are logged and ignored (nats-server
    # 2.12+ refuses them by default).
    strict: bool = True
    # The server-wide `limits {}` block (node/jetstream/config.py ServerLimits): 0 = none.
    limits: dict[str, int] = field(default_factory=dict)
    # Per stream, the publishes its leader holds proposed and not yet applied (inflight.py),
    # as nats-server bounds a stream's ingest queue: 0 = nats-server's defaults (100,000
    # messages, 128 MiB); past either, a publish is dropped with 429 (10167).
    max_buffered_msgs: int = 0
    max_buffered_size: int = 0
    # JetStream API requests served at once (node/jetstream/apiqueue.py): 0 = 10,000.
    request_queue_limit: int = 0


@dataclass
class Options:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT  # -1: a random port
    http_host: str = ""  # "": the client host, as in nats-server
    http_port: int = 0  # 0: monitoring disabled
    server_name: str | None = None
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_control_line: int = DEFAULT_MAX_CONTROL_LINE
    max_pending: int = DEFAULT_MAX_PENDING
    max_connections: int = 64 * 1024
    max_subscriptions: int = -1  # per client connection; -1 (config 0): no limit
    max_sub_tokens: int = 0  # tokens in a subscription's subject; 0: no limit
    ping_interval: float = 120.0
    ping_max: int = 2
    write_deadline: float = 10.0
    lame_duck_duration: float = 120.0
    lame_duck_grace_period: float = 10.0

    # Authorization. At most one of: users, token, (user, password).
    user: str | None = None
    password: str | None = None
    token: str | None = None
    users: list[User] = field(default_factory=list)
    no_auth_user: str | None = None
    default_permissions: Permissions | None = None  # for listed users without their own
    auth_timeout: float = 2.0

    # Accounts, $G's mappings and operator mode, read by node/accountconf.py and
    # node/resolver.py. Config keys stay in `unsupported` until the routing core
    # enforces them, so loading them never silently turns a check off.
    accounts: AccountsConfig | None = None
    mappings: MappingTable | None = None
    operator: OperatorConfig | None = None

    tls: TLSOptions | None = None
    websocket: WebsocketOptions | None = None
    cluster: ClusterOptions = field(default_factory=ClusterOptions)
    jetstream: JetStreamOptions = field(default_factory=JetStreamOptions)
    server_tags: list[str] = field(default_factory=list)

    debug: bool = False
    trace: bool = False
    log_file: str | None = None
    pid_file: str | None = None
    ports_file_dir: str | None = None
    config_file: str | None = None

    # Blocks accepted from a config file but not implemented: warned about at start.
    unsupported: list[str] = field(default_factory=list)
    # Security settings accepted from a config file but not enforced yet: the node
    # refuses to start ([FTL]) rather than run without them.
    unenforced: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    # The command-line flags (node/cli.py), applied again over the file on a reload.
    flags: dict[str, Any] = field(default_factory=dict)
