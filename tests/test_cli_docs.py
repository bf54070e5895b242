"""The command line's conventions (docs/cli.md): the generated reference
matches the parser, every documented example runs against a copy of a
store written by Apache RocketMQ, every option has help, the same names
mean the same things, completion scripts, ``--broker-conf`` and the time
arguments."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rmqstore import StoreConfig
from rmqstore.cli import EXAMPLES, _parser, cli_markdown, main

ROOT = Path(__file__).parent.parent
BASIC = Path(__file__).parent / "data" / "golden" / "basic"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def store(tmp_path):
    """A copy of the golden store, with a committed offset of group cg_basic (as a broker's file)."""
    root = Path(shutil.copytree(BASIC / "store", tmp_path / "store"))
    (root / "config").mkdir(exist_ok=True)
    (root / "config" / "consumerOffset.json").write_text(
        json.dumps({"offsetTable": {"TopicTest@cg_basic": {"0": 10, "1": 0}}}))
    return root


NO_SOURCE = pytest.mark.skipif(not (ROOT / "docs").is_dir(),
                               reason="no docs/ beside tests/ (a wheel's copy of the tests)")


@NO_SOURCE
def test_docs_cli_md_is_generated_from_the_parser():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert text == cli_markdown(), "docs/cli.md is stale: run `python -m rmqstore.cli --markdown > docs/cli.md`"


def test_every_command_and_option_is_documented():
    p = _parser()
    assert set(p.commands) == set(EXAMPLES) | {"spark"}  # (spark's jobs have their own parser)
    for name, sp in p.commands.items():
        assert sp.description, name
        for a in sp.arguments:
            assert a.help, f"{name} {a.option_strings or a.dest} has no help"


def test_the_same_names_for_the_same_things():
    """One name per concept across commands; earlier names only as hidden aliases."""
    p = _parser()
    shown = {name: {o for a in sp.arguments if a.help != "==SUPPRESS==" for o in a.option_strings}
             for name, sp in p.commands.items()}
    for name, opts in shown.items():
        assert not opts & {"--queue", "--max", "--config"}, name
        if name != "demo":  # (demo's --count is how many messages to write, not a limit)
            assert "--count" not in opts, name
    for name in ("info", "consumer-progress", "dump", "query-key", "query-msgid", "print-queue",
                 "offset-for-time", "verify", "clean", "tail", "report"):
        assert {"--json", "--quiet", "--broker-conf"} <= shown[name], name
    for name in ("dump", "query-key", "print-queue", "tail"):
        assert "--limit" in shown[name], name
    for name in ("recover", "clean"):
        assert {"--dry-run", "--yes"} <= shown[name], name


@pytest.mark.parametrize("argv, limit", [
    (["query-key", "S", "TopicTest", "order-1001", "--max", "3"], 3),
    (["print-queue", "S", "TopicTest", "0", "--count", "2"], 2),
    (["tail", "S", "--topic", "TopicTest", "--max", "4"], 4),
])
def test_earlier_option_names_still_work(argv, limit):
    args = _parser().parse_args(argv)
    assert args.limit == limit


def test_earlier_queue_and_config_names_still_work(tmp_path):
    (tmp_path / "b.conf").write_text("maxMessageSize=1024\n")
    args = _parser().parse_args(["tail", "S", "--topic", "T", "--queue", "2", "--config", str(tmp_path / "b.conf")])
    assert args.queue_id == 2 and args.broker_conf.config.max_message_size == 1024


def _examples():
    return [(name, ex) for name, exs in EXAMPLES.items() for ex in exs]


@pytest.mark.parametrize("name, example", _examples())
def test_every_documented_example_runs(name, example, store, tmp_path, capsys, monkeypatch):
    """A new operator's walk through docs/cli.md, on a copy of a golden store."""
    if name == "report":
        pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broker.conf").write_text(f"storePathRootDir={store}\nmapedFileSizeCommitLog=65536\n")
    words = shlex.split(example)
    assert words[0] == "rmqstore"
    subst = {"STORE": str(store), "NEW_STORE": str(tmp_path / "salvaged"), "DIR": str(tmp_path / "demo")}
    argv = [subst.get(w, w) for w in words[1:]]
    code, out, err = run(capsys, *argv)
    assert code in (0, 1), (example, code, err)
    if "--json" in argv:  # pure JSON on stdout: one document or JSON lines
        lines = out.splitlines()
        assert lines and (len(lines) == 1 or all(isinstance(json.loads(line), dict) for line in lines))
        json.loads(lines[0])
    if name in ("salvage", "recover"):  # the report alone on stdout; sentences on stderr
        assert isinstance(json.loads(out), dict) and err


def test_salvage_and_recover_print_only_json_on_stdout(store, tmp_path, capsys):
    code, out, err = run(capsys, "salvage", store, tmp_path / "new")
    assert code == 0 and json.loads(out)["messages_copied"] > 0 and "salvaged" in err
    code, out, err = run(capsys, "recover", store, "--dry-run")
    assert code == 0 and json.loads(out)["process_offset"] >= 0 and "nothing was changed" in err


# --- --broker-conf ----------------------------------------------------------------


def test_broker_conf_names_the_store_and_its_settings(store, tmp_path, capsys):
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerName=broker-a\nstorePathRootDir={store}\nstorePathCommitLog={store}/commitlog\n"
                    f"maxMessageSize=65536\nmapedFileSizeCommitLog=65536\nmapedFileSizeConsumeQueue=300000\n")
    code, out, _ = run(capsys, "info", "--broker-conf", conf, "--json")
    assert code == 0 and json.loads(out)["store"] == str(store)
    args = _parser().parse_args(["verify", "--broker-conf", str(conf)])
    cfg = args.broker_conf.config
    # the older spelling, and the ConsumeQueue size rounded up to whole 20-byte units as RocketMQ does
    assert cfg.mapped_file_size_commit_log == 65536 and cfg.mapped_file_size_consume_queue == 300000
    assert cfg.max_message_size == 65536
    # a STORE given wins over storePathRootDir
    (tmp_path / "other.conf").write_text(f"storePathRootDir={tmp_path}/nowhere\n")
    code, out, _ = run(capsys, "info", store, "--broker-conf", tmp_path / "other.conf", "--json")
    assert code == 0 and json.loads(out)["store"] == str(store)


def test_older_spellings_in_store_config():
    cfg = StoreConfig.from_dict({"mapedFileSizeCommitLog": "4096", "mappedFileSizeConsumeQueue": "401",
                                 "destroyMapedFileIntervalForcibly": "5000"}, strict=True)
    assert cfg.mapped_file_size_commit_log == 4096
    assert cfg.mapped_file_size_consume_queue == 420  # (401 rounded up to whole units)
    assert cfg.destroy_maped_file_interval_forcibly == 5000


def test_broker_conf_errors(store, tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "info")
    assert code == 2 and "--broker-conf" in err
    elsewhere = tmp_path / "elsewhere.conf"
    elsewhere.write_text(f"storePathRootDir={store}\nstorePathCommitLog={tmp_path}/cl\n")
    code, out, err = run(capsys, "dump", "--broker-conf", elsewhere)
    assert code == 2 and out == "" and "keeps the CommitLog at" in err
    bad = tmp_path / "bad.conf"
    bad.write_text("maxMessageSize=banana\n")
    code, _, err = run(capsys, "info", store, "--broker-conf", bad)
    assert code == 2 and "cannot use" in err
    # no storePathRootDir: RocketMQ's default, ~/store, and a notice that says so
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    shutil.copytree(store, tmp_path / "home" / "store")
    (tmp_path / "plain.conf").write_text("brokerName=b\n")
    code, out, err = run(capsys, "info", "--broker-conf", tmp_path / "plain.conf", "--json")
    assert code == 0 and json.loads(out)["store"] == str(tmp_path / "home" / "store")
    assert "sets no storePathRootDir" in err


# --- times ------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["dump", "S", "--begin", "1726732800"],
    ["query-key", "S", "TopicTest", "k", "--end", "1726732800"],
    ["offset-for-time", "S", "TopicTest", "0", "1726732800"],
])
def test_seconds_are_refused_with_a_hint(store, capsys, argv):
    code, out, err = run(capsys, *[str(store) if a == "S" else a for a in argv])
    assert code == 2 and out == ""
    assert "looks like seconds since epoch (2024-09-19T08:00:00+00:00)" in err and "1726732800000" in err


def test_ms_and_iso_times_give_the_same_answer(store, capsys):
    a = run(capsys, "dump", store, "--begin", "1726732800114", "--end", "1726732800200", "--body", "none")
    b = run(capsys, "dump", store, "--begin", "2024-09-19T08:00:00.114", "--end", "2024-09-19T08:00:00.200Z",
            "--body", "none")
    assert a[0] == b[0] == 0 and a[1] == b[1] and a[1]


# --- completion -------------------------------------------------------------------


def test_bash_completion_script(capsys):
    code, out, _ = run(capsys, "completion", "bash")
    assert code == 0
    for name in EXAMPLES:
        assert name in out
    assert "--skip-damaged" in out and "--broker-conf" in out
    if shutil.which("bash"):
        proc = subprocess.run(["bash", "-n"], input=out, text=True, capture_output=True)
        assert proc.returncode == 0, proc.stderr
        # sourced, it registers a completion function for rmqstore
        proc = subprocess.run(["bash", "-c", out + "\ncomplete -p rmqstore"], text=True, capture_output=True)
        assert proc.returncode == 0 and "rmqstore" in proc.stdout, proc.stderr


def test_completion_hints_are_shtabs():
    import shtab

    from rmqstore.cli import _COMPLETE_DIR, _COMPLETE_FILE

    assert _COMPLETE_DIR.items() <= shtab.DIRECTORY.items() and _COMPLETE_FILE.items() <= shtab.FILE.items()


def test_zsh_completion_script(capsys):
    code, out, _ = run(capsys, "completion", "zsh")
    assert code == 0 and out.startswith("#compdef rmqstore") and "consumer-progress" in out


def test_markdown_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "rmqstore.cli", "--markdown"], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0 and proc.stdout == cli_markdown()
