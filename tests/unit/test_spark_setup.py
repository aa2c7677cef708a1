"""Spark setup errors are plain and fast: Java missing, an unreachable master, an unknown key in
spark.yml. None of these start a JVM."""

import socket

import pytest
from kedro.config import OmegaConfigLoader

from recscale.config import ConfigError
from recscale.data.spark_session import SparkConfig, SparkSetupError, find_java, make_spark_session
from recscale.hooks import SparkHooks


def test_java_missing_says_what_to_install(tmp_path, monkeypatch):
    with pytest.raises(SparkSetupError, match=r"java was not found: JAVA_HOME is not set and no "
                                              r"java is on PATH.*openjdk-17-jre-headless"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(SparkSetupError, match=rf"JAVA_HOME={tmp_path} has no executable bin/java"):
        find_java({"JAVA_HOME": str(tmp_path), "PATH": "/usr/bin"})
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkSetupError, match="java was not found"):
        make_spark_session(SparkConfig(master="local[1]"))


def test_an_unreachable_master_fails_in_seconds_naming_it():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master = f"spark://127.0.0.1:{port}"
    with pytest.raises(SparkSetupError, match=rf"Spark master {master} is unreachable"):
        make_spark_session(SparkConfig(master=master, start_timeout_s=5))


def _context(tmp_path, spark_yml: str):
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "spark").mkdir()
    (conf / "spark" / "spark.yml").write_text(spark_yml)

    class Context:
        env = "spark"
        config_loader = OmegaConfigLoader(str(conf), base_env="base", default_run_env="spark")

    return Context()


def test_an_unknown_key_in_spark_yml_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key spark \(conf/spark/spark.yml\).mastr "
                                          r"\(did you mean 'master'\?\); "
                                          r"allowed keys under .*: app_name, conf, "):
        SparkHooks().after_context_created(_context(tmp_path, "mastr: local[2]\n"))
    with pytest.raises(ConfigError, match=r"spark \(conf/spark/spark.yml\).conf.sql.shuffle"
                                          r".partitions is not a Spark property"):
        SparkHooks().after_context_created(
            _context(tmp_path / "2", "conf:\n  sql.shuffle.partitions: 2\n"))
    with pytest.raises(ConfigError, match=r"master='spark:/host' is not allowed"):
        SparkHooks().after_context_created(_context(tmp_path / "3", "master: spark:/host\n"))


def test_an_environment_without_spark_yml_starts_no_spark(tmp_path):
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "test").mkdir()

    class Context:
        env = "test"
        config_loader = OmegaConfigLoader(str(conf), base_env="base", default_run_env="test")

    hooks = SparkHooks()
    hooks.after_context_created(Context())
    assert hooks.spark is None
