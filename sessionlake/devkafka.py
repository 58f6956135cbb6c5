"""A real single-node Kafka broker for development and tests, without Docker.

The broker is Kafka's own server (``kafka.Kafka``) from the jars ``make kafka-broker``
resolves from Maven Central into ``kafka-broker/``, started with ``java -cp`` in KRaft mode
as a combined broker and controller, on 127.0.0.1 only, with its data in a folder of your
choice. Used by the Kafka tests (one broker per test module) and by ``make kafka``::

    python -m sessionlake.devkafka --data-dir kafka-data --port 9092 [--topic clicks
        [--partitions 3] [--load demo/landing]]

The broker needs neither Spark nor a Python Kafka client: readiness is checked with one
Kafka ``ApiVersions`` request over a socket. Only ``--topic`` starts a local Spark driver,
for a moment, to create the topic and send it a folder's records through Kafka's own
client (:func:`sessionlake.kafkaadmin.load_topic`): the broker does not create topics on
first use, so that a mistyped ``--topic`` is refused rather than read empty forever.
"""

from __future__ import annotations

import argparse
import base64
import multiprocessing
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sessionlake.spark import PROJECT_ROOT

#: Where ``make kafka-broker`` puts the broker's jars (``SESSIONLAKE_KAFKA_BROKER`` overrides).
BROKER_JARS = PROJECT_ROOT / "kafka-broker"
LOG_CONFIG = PROJECT_ROOT / "conf" / "kafka-log4j2.properties"
#: The broker's heap: enough for tests and demos, small beside Spark's on a 2-core machine.
BROKER_HEAP = "512m"


class BrokerError(RuntimeError):
    """The broker could not be started: the message says why and what to do."""


def broker_jars_dir() -> Path:
    """The folder of the broker's jars, checked to hold the Kafka server.

    :raises BrokerError: with the command that fetches them, when it does not.
    """
    folder = Path(os.environ.get("SESSIONLAKE_KAFKA_BROKER") or BROKER_JARS)
    if not any(folder.glob("kafka_2.13-*.jar")):
        raise BrokerError(
            f"no Kafka server jars in {folder}: run `make kafka-broker` (resolves them "
            "from Maven Central once) or set SESSIONLAKE_KAFKA_BROKER to a folder that "
            "holds them"
        )
    return folder


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def new_cluster_id() -> str:
    """A random KRaft cluster id: a UUID in URL-safe base64, 22 characters.

    Never one that starts with ``-`` (one random id in 64 does): ``kafka-storage format
    -t`` would read it as an option and refuse to format, and the broker would not start.
    Kafka's own ``Uuid.randomUuid`` draws again for the same reason (kafka-clients 3.9.2).
    """
    while True:
        candidate = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not candidate.startswith("-"):
            return candidate


def server_properties(data_dir: Path, port: int, controller_port: int,
                      sasl: SaslListener | None = None) -> str:
    """``server.properties`` of a one-node KRaft cluster (broker and controller in one).

    Internal topics get one replica; topics are never created on first use, so a typo
    in a topic name fails instead of creating an empty topic. With ``sasl``, a second
    client listener asks for a user name and password (SASL/PLAIN), as secured clusters do.
    """
    listeners = [f"PLAINTEXT://127.0.0.1:{port}"]
    if sasl is not None:
        listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{sasl.port}")
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": ",".join([*listeners, f"CONTROLLER://127.0.0.1:{controller_port}"]),
        "advertised.listeners": ",".join(listeners),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ("CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,"
                                           "SASL_PLAINTEXT:SASL_PLAINTEXT"),
        "log.dirs": str(data_dir / "log"),
        "num.partitions": "1",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
    }
    if sasl is not None:
        users = " ".join(f'user_{name}="{password}"' for name, password in sasl.users.items())
        settings["sasl.enabled.mechanisms"] = "PLAIN"
        settings["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
            f"{PLAIN_LOGIN_MODULE} required {users};")
    return "".join(f"{key}={value}\n" for key, value in settings.items())


#: The JAAS login module of SASL/PLAIN, on both sides.
PLAIN_LOGIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


@dataclass(frozen=True)
class SaslListener:
    """A client listener that asks for a user name and password (SASL/PLAIN)."""

    port: int
    #: Password by user name.
    users: Mapping[str, str]

    def client_properties(self, user: str, password: str) -> str:
        """A ``--kafka-properties`` file's text that signs in as ``user``."""
        return ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                f'sasl.jaas.config={PLAIN_LOGIN_MODULE} required username="{user}" '
                f'password="{password}";\n')


def answers(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether a Kafka broker answers an ``ApiVersions`` request on ``host:port``.

    A listening socket is not enough: the broker accepts connections before it serves
    requests. Any well-formed answer with our correlation id counts.
    """
    client = b"sessionlake"
    correlation = 7
    body = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(struct.pack(">i", len(body)) + body)
            head = b""
            while len(head) < 8:
                chunk = conn.recv(8 - len(head))
                if not chunk:
                    return False
                head += chunk
    except OSError:
        return False
    _size, answered = struct.unpack(">ii", head)
    return answered == correlation


@dataclass
class KafkaBroker:
    """A running broker: where to reach it, and how to stop it."""

    bootstrap: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    #: The SASL/PLAIN listener, when the broker was started with ``sasl_users``.
    sasl: SaslListener | None = None

    @property
    def sasl_bootstrap(self) -> str:
        """``127.0.0.1:<port>`` of the SASL/PLAIN listener."""
        assert self.sasl is not None, "start_broker(..., sasl_users=...) opens it"
        return f"127.0.0.1:{self.sasl.port}"

    @property
    def log_file(self) -> Path:
        """The broker's console output (warnings and errors)."""
        return self.data_dir / "broker.log"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the broker: SIGTERM (a clean shutdown), SIGKILL if it takes too long."""
        if self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise BrokerError("no `java` on PATH and no JAVA_HOME: install JDK 17")
    return found


def start_broker(
    data_dir: Path, *, port: int | None = None, timeout_s: float = 90.0,
    sasl_users: Mapping[str, str] | None = None,
) -> KafkaBroker:
    """Format a fresh KRaft log in ``data_dir`` and start a broker on 127.0.0.1.

    Example::

        broker = start_broker(tmp_path / "kafka")
        try:
            ...  # use broker.bootstrap, e.g. "127.0.0.1:41234"
        finally:
            broker.stop()

    :param data_dir: an empty (or absent) folder for the configuration, log and data.
    :param port: the client port; a free one when not given.
    :param timeout_s: how long to wait for the broker to answer.
    :param sasl_users: password by user name: also open a SASL/PLAIN listener
        (:attr:`KafkaBroker.sasl_bootstrap`) that lets them in.
    :return: the running broker.
    :raises BrokerError: when the jars are missing, formatting fails, or the broker does
        not answer in time (the message quotes the end of its log).
    """
    jars = broker_jars_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    controller_port = free_port()
    sasl = SaslListener(free_port(), dict(sasl_users)) if sasl_users else None
    config = data_dir / "server.properties"
    config.write_text(server_properties(data_dir, port, controller_port, sasl))
    java = [_java(), f"-Xmx{BROKER_HEAP}", "-XX:+UseSerialGC",
            f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}",
            "-cp", f"{jars}/*"]
    formatted = subprocess.run(
        [*java, "kafka.tools.StorageTool", "format", "-t", new_cluster_id(), "-c", str(config)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if formatted.returncode != 0:
        raise BrokerError(f"formatting the broker's storage failed: "
                          f"{(formatted.stderr or formatted.stdout).strip()[-1000:]}")
    log = open(data_dir / "broker.log", "ab")  # noqa: SIM115 (the broker writes it)
    process = subprocess.Popen([*java, "kafka.Kafka", str(config)],
                               stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    broker = KafkaBroker(f"127.0.0.1:{port}", data_dir, process, sasl)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if answers("127.0.0.1", port):
            return broker
        time.sleep(0.5)
    broker.stop()
    tail = broker.log_file.read_text(errors="replace")[-2000:]
    raise BrokerError(f"the Kafka broker did not answer on {broker.bootstrap} within "
                      f"{timeout_s:g}s (exit status {process.poll()}); its log ends:\n{tail}")


def _load_topic(bootstrap: str, topic: str, partitions: int, folder: Path | None) -> int:
    """:func:`sessionlake.kafkaadmin.load_topic` through a local Spark driver in a child
    process: its JVM (about 520 MB) ends with it, instead of living as long as the broker
    (a stopped Spark session keeps its JVM until Python exits).

    :raises RuntimeError: with the load's error, as one line of text.
    """
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as child:
        return child.submit(_load_topic_here, bootstrap, topic, partitions, folder).result()


def _load_topic_here(bootstrap: str, topic: str, partitions: int, folder: Path | None) -> int:
    """:func:`_load_topic`'s work, in the child."""
    from sessionlake.kafkaadmin import load_topic
    from sessionlake.spark import build_spark

    spark = build_spark("local[1]", app_name="devkafka", shuffle_partitions=1,
                        conf={"spark.ui.enabled": "false"})
    try:
        return load_topic(spark, bootstrap, topic, partitions, folder)
    except Exception as error:  # py4j's errors do not cross processes: their text does
        raise RuntimeError(str(error).strip().splitlines()[0]) from None
    finally:
        spark.stop()


#: The lake :func:`main` suggests reading the broker's topic into.
DEMO_LAKE = Path("demo/kafka-lake")


def try_hint(bootstrap: str, topic: str, lake: Path) -> str:
    """The run to try against a broker just started. Each start is a new cluster, whose
    offsets a lake that read an earlier one refuses (rightly: they mean nothing here), so
    such a lake is named, with what to do, instead of a command that would be refused."""
    command = (f"  sessionlake run --source kafka --kafka-bootstrap {bootstrap} "
               f"--topic {topic} --lake {lake}")
    if not lake.exists():
        return f"Try:\n{command}"
    return (f"Try:\n{command}\nafter `rm -rf {lake}`: it holds what an earlier start of "
            "this broker gave, and each start is a new Kafka cluster, which its checkpoint "
            "refuses (or give another --lake)")


def main(argv: list[str] | None = None) -> int:
    """``python -m sessionlake.devkafka``: run a broker until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m sessionlake.devkafka",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("kafka-data"),
                        help="folder for the broker's log and data, wiped first (kafka-data)")
    parser.add_argument("--port", type=int, default=9092, help="client port (9092)")
    parser.add_argument("--topic", help="a topic to create once the broker is up")
    parser.add_argument("--partitions", type=int, default=3,
                        help="the topic's partitions (3)")
    parser.add_argument("--load", type=Path, metavar="DIR",
                        help="send the topic the non-blank lines of DIR's files, one "
                             "record each (e.g. sessionlake generate's output)")
    args = parser.parse_args(argv)
    if args.load is not None and (args.topic is None or not args.load.is_dir()):
        parser.error("--load needs --topic and an existing folder")
    if args.partitions < 1:
        parser.error("--partitions must be at least 1")
    shutil.rmtree(args.data_dir, ignore_errors=True)
    try:
        broker = start_broker(args.data_dir.resolve(), port=args.port)
    except BrokerError as error:
        print(f"devkafka: error: {error}", file=sys.stderr)
        return 2
    topic = args.topic or "TOPIC"
    if args.topic:
        try:
            sent = _load_topic(broker.bootstrap, args.topic, args.partitions, args.load)
        except Exception as error:  # py4j wraps the Java client's errors
            broker.stop()
            print(f"devkafka: error: topic {args.topic}: {error}", file=sys.stderr)
            return 2
        print(f"topic {args.topic}: {args.partitions} partition(s), {sent} record(s)"
              + (f" from {args.load}" if args.load else ""))
    print(f"Kafka broker on {broker.bootstrap} (KRaft, data and log in {args.data_dir}); "
          f"Ctrl-C stops it. {try_hint(broker.bootstrap, topic, DEMO_LAKE)}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.is_set() and broker.process.poll() is None:
        stop.wait(1.0)
    broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
