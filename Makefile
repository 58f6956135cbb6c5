# The one entry point for set-up, demo, tests, lint and benchmarks.
# Every target installs what it needs on first use (virtual environment, pinned packages,
# Delta jars from Maven Central) and is fast once installed.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
DEMO   := demo
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(BIN)/python)

LOCAL_FS_JAR := jars/sessionlake-hadoop.jar
LOCAL_FS_SOURCES := $(wildcard build/hadoop/sessionlake/hadoop/*.java)

.PHONY: setup jars class-archive kafka-broker kafka browser demo test test-fast lint bench clean help

help:
	@echo "make demo      - set up, sessionize the bundled Apache access log into demo/lake, print its sessions per day"
	@echo "make test      - set up, lint, then run the whole test suite (what CI runs)"
	@echo "make test-fast - the tests not marked slow"
	@echo "make lint      - ruff and mypy"
	@echo "make bench     - benchmarks (see the Benchmark section of README.md)"
	@echo "make setup     - only the virtual environment, the Delta and Kafka jars, the driver's class archive, the Kafka broker and Chromium"
	@echo "make jars, make class-archive, make kafka-broker, make browser - one part of set-up"
	@echo "make kafka     - a development Kafka broker (KRaft) on 127.0.0.1:$(KAFKA_PORT)"
	@echo "make airflow   - Airflow 3 standalone on http://$(AIRFLOW_HOST):$(AIRFLOW_PORT) with the DAGs, its home in $(AIRFLOW_HOME_DIR) (make airflow AIRFLOW_HOME=DIR for another)"
	@echo "make docker-up, make docker-down - Airflow on PostgreSQL and a Spark cluster in Docker (needs a Docker engine)"
	@echo "make clean     - remove demo/, kafka-data/ and the linters' and pytest's caches"

setup: $(VENV)/.installed jars/.resolved $(LOCAL_FS_JAR) class-archive kafka-broker/.resolved browser

# The driver JVM's class archive (sessionlake/classarchive.py): every later process maps
# the classes a small training stream loaded instead of loading them anew. Named by the
# JVM and the jars, so it is rebuilt (about a minute) only when either changes. Only a
# speed-up: when it cannot be built, set-up goes on and the drivers start without it.
class-archive: $(VENV)/.installed jars/.resolved $(LOCAL_FS_JAR)
	$(BIN)/python -m sessionlake.classarchive --if-missing \
	  || echo "no class archive (see above): the drivers will start without one"

# Headless Chromium and its driver (Debian's packages) for the health page's browser test;
# skipped when they are there. Needs root (CI runs as root).
browser:
	@test -x /usr/bin/chromium -a -x /usr/bin/chromedriver || { \
	  apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    chromium chromium-driver; }

$(VENV)/.installed: requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

jars: jars/.resolved $(LOCAL_FS_JAR)

# sessionlake's local file system for Hadoop (build/hadoop/; sessionlake/spark.py says why),
# compiled against the Hadoop classes of pip's Spark.
$(LOCAL_FS_JAR): $(LOCAL_FS_SOURCES) $(VENV)/.installed
	rm -rf build/hadoop/classes && mkdir -p build/hadoop/classes jars
	javac --release 17 -nowarn -d build/hadoop/classes -cp "$$($(BIN)/python -c \
	  'import pathlib, pyspark; print(pathlib.Path(pyspark.__file__).parent / "jars")')/*" \
	  $(LOCAL_FS_SOURCES)
	jar cf $@ -C build/hadoop/classes .

# No goal on the command line: build/pom.xml's defaultGoal names them (Delta's jars and
# Spark's Kafka source), so that docker/Dockerfile, which runs the same command, resolves
# the same jars.
jars/.resolved: build/pom.xml
	mkdir -p jars
	mvn --batch-mode --quiet -f build/pom.xml -Djars.dir=$(abspath jars)
	touch $@

# The Kafka server's jars (build/kafka-broker-pom.xml) for the development and test broker.
kafka-broker: kafka-broker/.resolved

kafka-broker/.resolved: build/kafka-broker-pom.xml
	mkdir -p kafka-broker
	mvn --batch-mode --quiet -f build/kafka-broker-pom.xml dependency:copy-dependencies \
	  -Dbroker.dir=$(abspath kafka-broker)
	touch $@

# A single-node KRaft broker on 127.0.0.1 for development, data in kafka-data/ (wiped at
# start); Ctrl-C stops it.
# The broker starts with topic $(KAFKA_TOPIC); KAFKA_LOAD=DIR also sends it DIR's records.
KAFKA_PORT ?= 9092
KAFKA_TOPIC ?= clicks
KAFKA_LOAD ?=

kafka: $(VENV)/.installed kafka-broker/.resolved jars/.resolved
	$(BIN)/python -m sessionlake.devkafka --data-dir kafka-data --port $(KAFKA_PORT) \
	  --topic $(KAFKA_TOPIC) $(if $(KAFKA_LOAD),--load $(KAFKA_LOAD))

# The demo's lake, landing folder and archive start afresh; anything else under demo/ (a
# generated clickstream, another lake) is kept.
demo: $(VENV)/.installed jars/.resolved $(LOCAL_FS_JAR) class-archive
	rm -rf $(DEMO)/lake $(DEMO)/landing $(DEMO)/archive && mkdir -p $(DEMO)/landing $(DEMO)/archive
	gunzip -c data/apache_access_2015.log.gz > $(DEMO)/landing/apache_access_2015.log
	$(BIN)/sessionlake run --source $(DEMO)/landing --format apache --lake $(DEMO)/lake
	$(BIN)/sessionlake sql --lake $(DEMO)/lake "$$(cat sql/demo_report.sql)"

lint: setup
	$(BIN)/ruff check $(wildcard sessionlake tests dags plugins jobs bench)
	$(BIN)/mypy

# Two test processes, a test file each at a time (module fixtures build their lake once),
# files in collection order (tests/conftest.py puts the longest first; xdist would otherwise
# start the files with the most tests first, and a long two-test file last).
PYTEST_WORKERS ?= 2

test: setup lint
	$(BIN)/pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25

test-fast: setup
	$(BIN)/pytest -m "not slow"

bench: setup
	$(BIN)/python -m bench

clean:
	rm -rf $(DEMO) kafka-data .pytest_cache .mypy_cache .ruff_cache

# --- Airflow -------------------------------------------------------------------------------
# `make airflow`: Airflow 3 standalone (SQLite, LocalExecutor) on http://localhost:8080 with
# the sessionlake DAGs; the admin password is in
# $(AIRFLOW_HOME_DIR)/simple_auth_manager_passwords.json.generated.
.PHONY: airflow
SESSIONLAKE_LAKE   ?= $(abspath $(DEMO))/lake
SESSIONLAKE_SOURCE ?= $(abspath $(DEMO))/landing
SESSIONLAKE_ARCHIVE ?= $(abspath $(DEMO))/archive
# The demo's landing folder holds an Apache access log (make demo runs with --format apache).
SESSIONLAKE_FORMAT ?= apache

# Airflow's home: airflow_home/ here, or a folder given on make's command line (make airflow
# AIRFLOW_HOME=DIR). An AIRFLOW_HOME of the environment is not taken: it is likely another
# Airflow's, whose database `airflow db migrate` would change.
AIRFLOW_HOME_DIR := $(abspath $(if $(filter command line,$(origin AIRFLOW_HOME)),$(AIRFLOW_HOME),airflow_home))

# Airflow signs its API tokens with a random 64-byte key written once to AIRFLOW_JWT_SECRET
# (mode 600) and read by command, so it is in no process's environment: the key Airflow
# generates itself is 16 bytes, which PyJWT warns is too short for HS512 at every token.
AIRFLOW_JWT_SECRET ?= $(AIRFLOW_HOME_DIR)/jwt_secret

# The UI and API listen on this machine only (Airflow's default is every interface), and
# the LocalExecutor starts AIRFLOW_PARALLELISM workers, not its default 32 (7 GiB on a
# 2-core machine, for DAGs that run one Spark job at a time).
AIRFLOW_HOST ?= 127.0.0.1
AIRFLOW_PARALLELISM ?= 4
# The UI and API's port; the tasks reach the API's execution endpoints there too (Airflow
# assumes 8080 unless told).
AIRFLOW_PORT ?= 8080
AIRFLOW_ENV = AIRFLOW_HOME=$(AIRFLOW_HOME_DIR) \
	AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__PLUGINS_FOLDER=$(CURDIR)/plugins \
	AIRFLOW__CORE__LOAD_EXAMPLES=False \
	AIRFLOW__CORE__PARALLELISM=$(AIRFLOW_PARALLELISM) \
	AIRFLOW__API__HOST=$(AIRFLOW_HOST) \
	AIRFLOW__API__PORT=$(AIRFLOW_PORT) \
	AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:$(AIRFLOW_PORT)/execution/ \
	AIRFLOW__API_AUTH__JWT_SECRET_CMD="cat $(abspath $(AIRFLOW_JWT_SECRET))"

$(AIRFLOW_JWT_SECRET):
	mkdir -p $(@D) && umask 077 && python3 -c 'import secrets; print(secrets.token_hex(64))' > $@

# Airflow's simple auth manager writes the admin password it generates to this file, with
# the umask's mode (644 as a rule). Made first, and mode 600, it keeps that mode: Airflow
# opens it to append, reads an empty one as no passwords, and writes them into it.
AIRFLOW_PASSWORDS ?= $(AIRFLOW_HOME_DIR)/simple_auth_manager_passwords.json.generated
.PHONY: airflow-passwords
airflow-passwords:
	mkdir -p $(dir $(AIRFLOW_PASSWORDS)) && touch $(AIRFLOW_PASSWORDS) \
	  && chmod 600 $(AIRFLOW_PASSWORDS)

# The one-slot pool of the tasks that write the streaming checkpoint (see
# docs/airflow-at-scale.md): without it the scheduler never starts those tasks.
airflow: $(VENV)/.installed jars/.resolved $(LOCAL_FS_JAR) class-archive $(AIRFLOW_JWT_SECRET) \
		airflow-passwords
	mkdir -p $(AIRFLOW_HOME_DIR) $(SESSIONLAKE_SOURCE)
	$(AIRFLOW_ENV) $(BIN)/airflow db migrate
	$(AIRFLOW_ENV) $(BIN)/airflow pools set sessionlake_checkpoint 1 \
	  "tasks that write the streaming checkpoint: one at a time"
	$(AIRFLOW_ENV) \
	AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[*]"}' \
	SESSIONLAKE_LAKE=$(SESSIONLAKE_LAKE) \
	SESSIONLAKE_SOURCE=$(SESSIONLAKE_SOURCE) \
	SESSIONLAKE_ARCHIVE=$(SESSIONLAKE_ARCHIVE) \
	SESSIONLAKE_FORMAT=$(SESSIONLAKE_FORMAT) \
	PATH=$(abspath $(BIN)):$$PATH \
	$(BIN)/airflow standalone

# --- Docker: Airflow 3 on PostgreSQL + a Spark standalone cluster (docker/compose.yaml) ----
# Needs a Docker engine with the compose plugin. Builds both images on first use; returns
# once every service is healthy. The UI is on http://localhost:8080, Spark's on :8081.
.PHONY: docker-up docker-down
COMPOSE := docker compose -f docker/compose.yaml
# The keys every Airflow container must share (each would otherwise write its own random
# ones to its own airflow.cfg), written once to docker/.env, where compose looks for
# variables; one set in the environment wins over the file's:
#   SESSIONLAKE_JWT_SECRET      signs the API's tokens (api-server, task runners); 64 bytes
#   SESSIONLAKE_API_SECRET_KEY  signs the api-server's requests to the log servers; 64 bytes
#   SESSIONLAKE_FERNET_KEY      encrypts connections and variables in the database; a Fernet
#                               key (urlsafe base64 of 32 bytes): a new one cannot read them
#   SESSIONLAKE_POSTGRES_PASSWORD  the metadata database's; Postgres takes it when its volume
#                               is first made, so a file from before it was written here (it
#                               holds the JWT secret) gets the password then fixed, `airflow`
# Each run adds the keys the file lacks (one written by an older Makefile holds only the
# first) and keeps those it has, so that running services keep working.
DOCKER_ENV ?= docker/.env
.PHONY: $(DOCKER_ENV)

$(DOCKER_ENV):
	umask 077 && touch $@ && chmod 600 $@ && \
	add() { grep -q "^$$1=" $@ || printf '%s=%s\n' "$$1" \
	  "$$(python3 -c "import base64, secrets; print($$2)")" >> $@; } && \
	if grep -q '^SESSIONLAKE_JWT_SECRET=' $@; then \
	  add SESSIONLAKE_POSTGRES_PASSWORD '"airflow"'; fi && \
	add SESSIONLAKE_JWT_SECRET 'secrets.token_hex(64)' && \
	add SESSIONLAKE_API_SECRET_KEY 'secrets.token_hex(64)' && \
	add SESSIONLAKE_FERNET_KEY 'base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()' && \
	add SESSIONLAKE_POSTGRES_PASSWORD 'secrets.token_hex(32)'

docker-up: $(DOCKER_ENV)
	$(COMPOSE) up --detach --build --wait --wait-timeout 600

docker-down:
	$(COMPOSE) down
