"""A SparkSession from a typed config, with the checks that make setup errors plain.

``conf/<env>/spark.yml`` holds a :class:`SparkConfig` (the project hook parses it and calls
:func:`make_spark_session`; a notebook can call it directly). Before a JVM starts: Java 17+ must
be found (``JAVA_HOME`` or ``java`` on PATH), and a ``spark://`` master must accept a connection;
after it starts, a cluster master must give the application executors within ``start_timeout_s``.
Each failure raises :class:`SparkSetupError` naming what is wrong (instead of Spark's own minutes
of retries or an endless "Initial job has not accepted any resources"). Spark's log4j chatter is
kept at ``log_level`` and the console progress bar is off, so our own progress lines stay readable.
pyspark is imported only here and in ``spark_preprocess``, lazily: the pyarrow engine never needs it.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from recscale.config import ConfigError, Validated, check

log = logging.getLogger(__name__)

MIN_JAVA = 17
_MASTER = re.compile(r"^(local(\[(\*|\d+)(,\d+)?\])?|spark://[^/]+|yarn|k8s://.+)$")


class SparkSetupError(RuntimeError):
    """Spark cannot start here: Java missing or too old, master unreachable, no executors."""


@dataclass(frozen=True)
class SparkConfig(Validated):
    """The keys of ``conf/<env>/spark.yml``."""

    master: str = "local[*]"  # local[N] | spark://host:7077 | yarn | k8s://https://host:port
    app_name: str = "recscale"
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "WARN"  # Spark's own log4j level
    # JVM start, and for a cluster master until min_executors executors have registered
    start_timeout_s: float = 120.0
    min_executors: int = 1  # cluster masters only (local mode runs tasks in the driver)
    conf: dict[str, Any] = field(default_factory=dict)  # any spark.* property

    def validate(self, prefix: str = "spark") -> None:
        check(bool(_MASTER.match(self.master)), f"{prefix}.master", self.master,
              "local[*], local[N], spark://host:port, yarn or k8s://...")
        check(self.start_timeout_s > 0, f"{prefix}.start_timeout_s", self.start_timeout_s, "> 0")
        check(self.min_executors >= 0, f"{prefix}.min_executors", self.min_executors, ">= 0")
        for key in self.conf:
            if not str(key).startswith("spark."):
                raise ConfigError(f"{prefix}.conf.{key} is not a Spark property: expected keys that "
                                  "start with 'spark.' (https://spark.apache.org/docs/latest/"
                                  "configuration.html)")
            if key in ("spark.master", "spark.app.name"):
                raise ConfigError(f"{prefix}.conf.{key}: set {prefix}."
                                  f"{'master' if key == 'spark.master' else 'app_name'} instead")


def find_java(env: dict[str, str] | None = None) -> str:
    """Path of the java that Spark will run; SparkSetupError naming what to install otherwise."""
    env = os.environ if env is None else env
    home = env.get("JAVA_HOME")
    install = ("Spark needs Java {v}+: install it (Debian: apt-get install openjdk-17-jre-headless; "
               "`make system-packages` does this where allowed) or point JAVA_HOME at one")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise SparkSetupError(f"JAVA_HOME={home} has no executable bin/java. "
                                  + install.format(v=MIN_JAVA))
    else:
        java = shutil.which("java", path=env.get("PATH", ""))
        if java is None:
            raise SparkSetupError("java was not found: JAVA_HOME is not set and no java is on "
                                  "PATH. " + install.format(v=MIN_JAVA))
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkSetupError(f"{java} -version failed ({exc}). " + install.format(v=MIN_JAVA)) \
            from exc
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if m:
        major = int(m.group(1)) if m.group(1) != "1" else int(m.group(2) or 0)
        if major < MIN_JAVA:
            raise SparkSetupError(f"{java} is Java {major}. " + install.format(v=MIN_JAVA))
    return java


def check_master_reachable(master: str, timeout_s: float = 5.0) -> None:
    """A ``spark://h1:p1[,h2:p2]`` master must accept a TCP connection (Spark itself retries
    registration for a minute and then leaves the application without executors)."""
    if not master.startswith("spark://"):
        return
    errors = []
    for hp in master[len("spark://"):].split(","):
        host, _, port = hp.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            errors.append(f"{hp}: {exc}")
    raise SparkSetupError(f"Spark master {master} is unreachable ({'; '.join(errors)}): start it "
                          "or fix master in conf/<env>/spark.yml")


_LOG4J2 = """\
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
logger.shutdown.name = org.apache.spark.util.ShutdownHookManager
logger.shutdown.level = error
"""


def _log4j2_file(level: str) -> str:
    path = os.path.join(tempfile.gettempdir(), f"recscale-spark-log4j2-{level.lower()}.properties")
    if not os.path.exists(path):
        with open(path, "w") as fh:
            fh.write(_LOG4J2.format(level=level.lower()))
    return path


def make_spark_session(cfg: SparkConfig | None = None):
    """Start (or reuse) the SparkSession ``cfg`` describes; see the module docstring."""
    cfg = cfg or SparkConfig()
    find_java()
    check_master_reachable(cfg.master, timeout_s=min(5.0, cfg.start_timeout_s))
    from pyspark.sql import SparkSession

    # Python workers run this interpreter (pyspark reads the variable when the context starts;
    # workers on other hosts need the same path, or PYSPARK_PYTHON set there)
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    if cfg.master.startswith("local"):  # one host: bind to loopback, no "resolves to" warning
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # py4j logs every gateway connection it closes at INFO, also from __del__ at interpreter
    # exit (after logging's streams closed: "--- Logging error ---"); nothing a person needs
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log4j = f"-Dlog4j2.configurationFile=file:{_log4j2_file(cfg.log_level)}"
    defaults = {"spark.ui.showConsoleProgress": "false",
                "spark.driver.extraJavaOptions": log4j,
                "spark.executor.extraJavaOptions": log4j,
                "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
                "spark.pyspark.python": os.environ["PYSPARK_PYTHON"]}
    conf = {**defaults, **{k: str(v) for k, v in cfg.conf.items()}}
    builder = SparkSession.builder.master(cfg.master).appName(cfg.app_name)
    for k, v in conf.items():
        builder = builder.config(k, v)
    t0 = time.perf_counter()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(cfg.log_level)
    if not cfg.master.startswith("local") and cfg.min_executors:
        _wait_for_executors(spark, cfg, t0)
    log.info("Spark %s session on %s (%.1f s)", spark.version, cfg.master, time.perf_counter() - t0)
    return spark


def _python() -> str:
    import sys

    return sys.executable


def _wait_for_executors(spark, cfg: SparkConfig, t0: float) -> None:
    deadline = t0 + cfg.start_timeout_s
    sc = spark.sparkContext
    while True:
        n = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # minus the driver
        if n >= cfg.min_executors:
            return
        if time.perf_counter() > deadline or sc._jsc.sc().isStopped():
            spark.stop()
            raise SparkSetupError(
                f"Spark master {cfg.master} gave this application {n} executor(s) in "
                f"{cfg.start_timeout_s:g} s (start_timeout_s); expected at least "
                f"{cfg.min_executors}: are its workers up, with enough free cores and memory?")
        time.sleep(0.25)
