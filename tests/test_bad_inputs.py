"""The bad-input corpus (tests/bad_inputs/): every expected failure prints exactly one line,
exits with code 2 and shows no traceback; `--debug` shows it. Also: a run directory is
replaced atomically, so a failed save never leaves a half-written run behind."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_trace, simulate
from lmsim.cli import main
from lmsim.engine.results import Results
from lmsim.errors import ConfigError, LmsimError
from lmsim.study.rundir import is_complete, load_run, save_run

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
CASES = sorted(p.name for p in CORPUS.iterdir() if p.is_dir())
REPO_ROOT = CORPUS.parents[1]

# Subprocess start-up costs ~0.5 s, so only a few cases (one per family) go through the
# real entry point; the rest run in-process through the same `main`.
SUBPROCESS_CASES = [
    "yaml_syntax_error",
    "trace_malformed_line",
    "trace_zero_byte_parquet",
    "profile_non_monotone_grid",
    "policy_unknown_name",
    "linear_profile_without_blocks",
    "out_run_dot",
    "out_run_into_a_foreign_folder",
]


def _copy_case(name: str, tmp_path: Path) -> Path:
    # Run in a copy: a case that unexpectedly succeeds must not write into the repository.
    case = tmp_path.resolve() / name
    shutil.copytree(CORPUS / name, case)
    return case


def _expected(case: Path) -> str:
    return (case / "expected").read_text().rstrip("\n").replace("{case}", str(case))


def _argv(case: Path) -> list[str]:
    return shlex.split((case / "cmd").read_text().replace("{case}", str(case)))


def _snapshot(case: Path) -> dict[str, bytes | None]:
    """Every file (bytes) and folder (None) under the case, by relative path."""
    return {
        str(p.relative_to(case)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(case.rglob("*"))
        if "__pycache__" not in p.parts
    }


def test_corpus_covers_every_family_the_issue_lists():
    required = {
        # YAML
        "yaml_syntax_error", "yaml_unknown_top_key", "yaml_unknown_nested_key", "yaml_wrong_type",
        "yaml_out_of_range", "yaml_missing_file", "yaml_empty_sweep_list",
        # traces
        "trace_malformed_line", "trace_negative_length", "trace_missing_field",
        "trace_backwards_timestamp", "trace_inconsistent_hash_ids", "trace_empty_jsonl",
        "trace_zero_byte_parquet",
        # profiles
        "profile_missing_table", "profile_non_monotone_grid",
        # policies
        "policy_unknown_name", "policy_unknown_parameter", "policy_bad_parameter_value",
        # output safety: nothing lmsim did not write is replaced
        "out_run_dot", "out_run_working_directory_absolute", "out_run_onto_a_file",
        "run_out_under_a_file", "out_run_into_a_foreign_folder", "out_run_onto_a_finished_run",
        "out_run_onto_a_sweep", "run_on_a_sweep_yaml", "out_sweep_onto_a_run",
        "out_sweep_into_a_foreign_folder", "out_trace_convert_onto_a_foreign_file",
        "out_profile_plot_onto_a_foreign_file", "out_bench_json_onto_a_foreign_file",
        "plugin_module_not_importable",
    }
    assert required <= set(CASES), sorted(required - set(CASES))
    assert len(CASES) >= 30
    for name in CASES:
        assert (CORPUS / name / "cmd").is_file(), name
        assert len((CORPUS / name / "expected").read_text().splitlines()) == 1, name


@pytest.mark.parametrize("name", CASES)
def test_bad_input_prints_its_one_line_and_exits_2(name, tmp_path, monkeypatch, capsys):
    case = _copy_case(name, tmp_path)
    before = _snapshot(case)
    monkeypatch.chdir(case)
    code = main(_argv(case))
    out, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines() == [_expected(case)]
    assert "Traceback" not in err
    assert out == ""
    # Nothing written, nothing removed: every file the case holds (the user's notes, an
    # earlier run, a sweep) survives byte for byte, and no output appears.
    assert _snapshot(case) == before


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_bad_input_through_the_real_entry_point(name, tmp_path):
    case = _copy_case(name, tmp_path)
    before = _snapshot(case)
    proc = subprocess.run(
        [sys.executable, "-m", "lmsim", *_argv(case)],
        cwd=case,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 2
    assert proc.stderr == _expected(case) + "\n"
    assert proc.stdout == ""
    assert _snapshot(case) == before


def _env() -> dict[str, str]:
    import os

    # the repository on the path even when lmsim is not pip-installed
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_debug_reraises_the_error_in_process(tmp_path, monkeypatch):
    case = _copy_case("trace_backwards_timestamp", tmp_path)
    monkeypatch.chdir(case)
    with pytest.raises(LmsimError) as info:
        main(["--debug", *_argv(case)])
    assert f"lmsim: error: {info.value}" == _expected(case)


def test_debug_shows_the_traceback_from_the_command_line(tmp_path):
    case = _copy_case("policy_unknown_name", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "lmsim", "--debug", *_argv(case)],
        cwd=case,
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 1  # an uncaught exception, as Python reports it
    assert proc.stderr.startswith("Traceback (most recent call last):")
    assert proc.stderr.rstrip().splitlines()[-1].startswith("lmsim.errors.ConfigError: exp.yaml: router.policy:")


# -- atomic results -------------------------------------------------------------------------


def _results() -> Results:
    return simulate(make_trace([0.0, 0.5], [100, 40], [4, 2]))


def test_save_refuses_a_directory_lmsim_did_not_write(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("the user's")
    with pytest.raises(ConfigError, match="was not written by lmsim"):
        save_run(_results(), run_dir, figure=False)
    assert [p.name for p in run_dir.iterdir()] == ["notes.txt"]
    assert (run_dir / "notes.txt").read_text() == "the user's"


def test_save_refuses_a_run_directory_holding_a_foreign_file(tmp_path):
    run_dir = tmp_path / "run"
    save_run(_results(), run_dir, figure=False)
    (run_dir / "notes.txt").write_text("added by the user")
    with pytest.raises(ConfigError, match=r"holds files lmsim did not write \(notes.txt\)"):
        save_run(_results(), run_dir, figure=False)
    assert (run_dir / "notes.txt").read_text() == "added by the user"


def test_save_replaces_an_existing_run_directory_completely(tmp_path):
    run_dir = tmp_path / "run"
    save_run(_results(), run_dir, figure=False)
    (run_dir / "cdf.png").write_text("a figure from an older run")
    save_run(_results(), run_dir, figure=False)
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "config.yaml", "instances.parquet", "lmsim.json", "requests.parquet", "router_events.parquet",
        "summary.json",
    ]
    # no temporary or backup siblings are left next to it
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    assert load_run(run_dir).summary["num_finished"] == 2


def test_a_save_that_fails_midway_leaves_the_previous_run_untouched(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    save_run(_results(), run_dir, figure=False)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}

    import lmsim.study.rundir as results_module

    # fail after requests.parquet and instances.parquet are written to the temporary dir
    calls = {"n": 0}
    real = results_module.pq.write_table

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(results_module.pq, "write_table", flaky)
    with pytest.raises(OSError, match="disk full"):
        save_run(_results(), run_dir, figure=False)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert is_complete(run_dir)


def test_a_failed_first_save_leaves_no_run_directory(tmp_path, monkeypatch):
    import lmsim.study.rundir as results_module

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(results_module.pq, "write_table", explode)
    with pytest.raises(OSError):
        save_run(_results(), tmp_path / "run", figure=False)
    assert not (tmp_path / "run").exists()
    assert not is_complete(tmp_path / "run")
