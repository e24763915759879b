"""Bad input on the command line: one `hydraplan: error: ...` line naming the flag or the file.

Validation errors of the planner's `PlanRequest`/`SolverOptions` come back as the flag that set
the field; every file the CLI reads names itself when it is binary, not JSON, or another kind of
hydraplan file.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import threading
from pathlib import Path

import pytest
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from test_cli import TINY, assert_one_line_error, run, write

from hydraplan.api.cli.inputs import describe_request_error
from hydraplan.planner import schemas

BINARY = b"\xff\xfe\x00\x01binary\x00"
BINARY_MESSAGE = "not UTF-8 text (byte 0xff at offset 0); is it a binary file?"


# ---------------------------------------------------------------------------------------------
# Validation errors name the CLI flag
# ---------------------------------------------------------------------------------------------


def test_a_partial_node_is_a_cluster_but_more_must_be_whole_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "plan", *TINY, "--num-gpus", "7", "--json")
    assert code == 0, err
    assert json.loads(out)["num_gpus"] == 7
    code, _, err = run(capsys, "plan", *TINY, "--num-gpus", "12")
    assert assert_one_line_error(code, err) == "--num-gpus 12: not a multiple of --gpus-per-node 8"
    code, _, err = run(capsys, "plan", *TINY, "--num-gpus", "12", "--gpus-per-node", "4", "--json")
    assert code == 0, err


@pytest.mark.parametrize("command", [["schemes"], ["profile", "--analytic"]])
def test_commands_without_a_request_name_the_cluster_flags_too(
    capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """`schemes` and `profile` check the cluster in the analytic cost model, not in PlanRequest."""
    code, _, err = run(capsys, *command, "--model", "tiny", "--num-gpus", "12")
    assert assert_one_line_error(code, err) == "--num-gpus 12: not a multiple of --gpus-per-node 8"


@pytest.mark.parametrize(
    ("flags", "lead", "bound"),
    [
        (["--time-limit-s", "1000"], "--time-limit-s 1000.0: ", "600"),
        (["--max-schemes", "9"], "--max-schemes 9: ", "8"),
    ],
)
def test_solver_option_bounds_name_the_flag(
    capsys: pytest.CaptureFixture[str], flags: list[str], lead: str, bound: str
) -> None:
    code, _, err = run(capsys, "plan", *TINY, *flags)
    message = assert_one_line_error(code, err)
    assert message.startswith(lead) and bound in message and "SolverOptions" not in message


def test_a_new_request_validator_gets_a_flag_named_message(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A validator added to PlanRequest (here: a bound on total tokens) needs no CLI change."""

    class BoundedRequest(schemas.PlanRequest):
        @model_validator(mode="after")
        def _bounded_total(self) -> BoundedRequest:
            if sum(self.lengths) > 10_000:
                raise ValueError(
                    f"lengths sum to {sum(self.lengths)} tokens, more than 10000 on num_gpus {self.num_gpus}"
                )
            return self

    monkeypatch.setattr(schemas, "PlanRequest", BoundedRequest)
    lengths = write(tmp_path, "L.txt", "6000\n6000\n")
    code, _, err = run(capsys, "plan", *TINY, "--lengths", lengths, "--oversize", "split")
    message = assert_one_line_error(code, err)
    assert message == f"--lengths {lengths}: lengths sum to 12000 tokens, more than 10000 on --num-gpus 8"
    code, _, err = run(capsys, "plan", *TINY)  # a sampled batch: the flag is --num-tokens
    assert assert_one_line_error(code, err).startswith("--num-tokens 20000: lengths sum to ")


def test_an_absurd_length_under_oversize_split_names_the_lengths_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The planner's PlanRequest refuses a 10^15-token length (planner/limits.py); the CLI names
    the lengths file, in one line."""
    with pytest.raises(ValidationError):
        schemas.PlanRequest(lengths=[10**15], num_gpus=8)
    lengths = write(tmp_path, "L.txt", f"1000\n{10**15}\n")
    code, _, err = run(capsys, "plan", *TINY, "--lengths", lengths, "--oversize", "split")
    message = assert_one_line_error(code, err)
    assert message.startswith(f"--lengths {lengths}: ") and "PlanRequest" not in message


class FutureRequest(BaseModel):
    """Stand-in for validators other layers may add: field bounds and whole-model checks."""

    lengths: list[int] = Field(max_length=2)
    num_gpus: int = Field(le=64)
    gpus_per_node: int = 8
    previous_strategy: str | None = None
    gap_tolerance: float = Field(0.01, le=1)

    @field_validator("previous_strategy")
    @classmethod
    def _fits(cls, text: str | None) -> str | None:
        if text is not None:
            raise ValueError(f"{text} uses 16 GPUs, the cluster has fewer")
        return text

    @model_validator(mode="after")
    def _per_node(self) -> FutureRequest:
        if self.gpus_per_node > self.num_gpus:
            raise ValueError(f"gpus_per_node {self.gpus_per_node} exceeds num_gpus {self.num_gpus}")
        return self


PLAN_FLAGS = argparse.Namespace(
    lengths="batch.txt",
    num_gpus=128,
    gpus_per_node=8,
    previous_strategy="1x<16,1,1>",
    previous_plan=None,
    num_tokens=1000,
)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"lengths": [1, 2, 3], "num_gpus": 8},
            "--lengths batch.txt: List should have at most 2 items after validation, not 3",
        ),
        ({"lengths": [1], "num_gpus": 128}, "--num-gpus 128: Input should be less than or equal to 64"),
        (
            {"lengths": [1], "num_gpus": 8, "previous_strategy": "1x<16,1,1>"},
            "--previous-strategy '1x<16,1,1>': 1x<16,1,1> uses 16 GPUs, the cluster has fewer",
        ),
        ({"lengths": [1], "num_gpus": 4}, "--gpus-per-node 8: exceeds --num-gpus 4"),
        ({"lengths": [1], "num_gpus": 8, "gap_tolerance": 2}, "gap_tolerance: Input should be less than or equal to 1"),
    ],
)
def test_validation_errors_map_to_flags_generically(fields: dict, expected: str) -> None:
    with pytest.raises(ValidationError) as caught:
        FutureRequest(**fields)
    assert describe_request_error(caught.value, PLAN_FLAGS) == expected


def test_the_previous_plan_flag_is_blamed_for_its_strategy() -> None:
    flags = argparse.Namespace(**{**vars(PLAN_FLAGS), "previous_plan": "last.json"})
    with pytest.raises(ValidationError) as caught:
        FutureRequest(lengths=[1], num_gpus=8, previous_strategy="1x<16,1,1>")
    assert describe_request_error(caught.value, flags).startswith("--previous-plan last.json: ")


# ---------------------------------------------------------------------------------------------
# `check` and the other JSON readers: the wrong kind of file, or not a plan at all
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def pool_path(tmp_path: Path) -> str:
    return write(tmp_path, "pool.json", json.dumps({"schema_version": "hydraplan.pool/1", "strategies": ["8x<1,1,1>"]}))


def test_check_names_a_profile_or_a_pool_given_as_a_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, user_profile_data: dict, pool_path: str
) -> None:
    profile = write(tmp_path, "profile.json", json.dumps(user_profile_data))
    unversioned = {key: value for key, value in user_profile_data.items() if key != "schema_version"}
    bare_profile = write(tmp_path, "bare.json", json.dumps(unversioned))
    catalog = write(tmp_path, "models.json", json.dumps({"models": []}))
    for path, kind in [
        (profile, "a cost profile"),
        (bare_profile, "a cost profile"),
        (pool_path, "a strategy pool"),
        (catalog, "a model catalog"),
    ]:
        code, _, err = run(capsys, "check", path)
        assert assert_one_line_error(code, err) == f"{path} is {kind}, not a plan"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "something else"}', "not a valid plan: plan_id: Field required (and "),
        ("[1, 2, 3]", "not a valid plan: the top level must be a JSON object, got an array"),
        ('{"schema_version": "hydraplan.plan/9"}', "schema_version 'hydraplan.plan/9' is not supported"),
        ("{oops", "not a valid plan: not valid JSON: line 1 column 2"),
    ],
)
def test_check_other_json_gets_one_short_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, "other.json", text)
    code, _, err = run(capsys, "check", path)
    message = assert_one_line_error(code, err)
    assert message.startswith(f"{path}: ") and expected in message
    assert len(message) < len(path) + 160, message


def test_every_json_reader_names_the_wrong_kind_of_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_plan_path: Path, user_profile_path: Path, pool_path: str
) -> None:
    plan = str(tiny_plan_path)
    gpus = write(tmp_path, "gpus.json", json.dumps({"gpus": []}))
    cases = [
        (
            ["plan", *TINY, "--previous-plan", str(user_profile_path)],
            f"{user_profile_path} is a cost profile, not a plan",
        ),
        (["plan", *TINY, "--strategy-pool", plan], f"{plan} is a plan, not a strategy pool"),
        (["plan", *TINY, "--profile", pool_path], f"{pool_path} is a strategy pool, not a cost profile"),
        (["check", plan, "--profile", plan], f"{plan} is a plan, not a cost profile"),
        (["plan", *TINY, "--models-file", gpus], f"{gpus} is a GPU catalog, not a model catalog"),
        (["models", "--models-file", gpus], f"{gpus} is a GPU catalog, not a model catalog"),
    ]
    for argv, expected in cases:
        code, _, err = run(capsys, *argv)
        assert assert_one_line_error(code, err) == expected, argv


# ---------------------------------------------------------------------------------------------
# Binary and non-UTF-8 files: every file the CLI reads names itself
# ---------------------------------------------------------------------------------------------


READERS = {
    "lengths": lambda f, plan: ["plan", *TINY, "--lengths", f],
    "plan profile": lambda f, plan: ["plan", *TINY, "--profile", f],
    "models file": lambda f, plan: ["plan", *TINY, "--models-file", f],
    "gpus file": lambda f, plan: ["plan", *TINY, "--gpus-file", f],
    "previous plan": lambda f, plan: ["plan", *TINY, "--previous-plan", f],
    "strategy pool": lambda f, plan: ["plan", *TINY, "--strategy-pool", f],
    "check plan": lambda f, plan: ["check", f],
    "check profile": lambda f, plan: ["check", plan, "--profile", f],
    "schemes profile": lambda f, plan: ["schemes", "--profile", f],
    "strategies profile": lambda f, plan: ["strategies", "--num-batches", "1", "--profile", f],
    "profile models file": lambda f, plan: ["profile", "--analytic", "--models-file", f],
    "models": lambda f, plan: ["models", "--models-file", f],
    "gpus": lambda f, plan: ["gpus", "--gpus-file", f],
}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_binary_file_is_named_wherever_it_is_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_plan_path: Path, reader: str
) -> None:
    path = tmp_path / "input.bin"
    path.write_bytes(BINARY)
    code, _, err = run(capsys, *READERS[reader](str(path), str(tiny_plan_path)))
    assert assert_one_line_error(code, err) == f"{path}: {BINARY_MESSAGE}"


@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_stops_at_the_input_size_limit_and_reads_no_device_without_end(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    tiny_plan_path: Path,
    reader: str,
) -> None:
    # /dev/zero (or any stream without end) given as a file was read until memory ran out; a
    # regular file over the limit is refused before it is read, a stream once it gives more
    monkeypatch.setattr("hydraplan.cost_models.profile_io.MAX_INPUT_FILE_BYTES", 50_000)  # the plan is ~23 KB
    big = write(tmp_path, "big.json", " " * 60_000)
    code, _, err = run(capsys, *READERS[reader](big, str(tiny_plan_path)))
    assert assert_one_line_error(code, err) == f"{big}: 60,000 bytes, more than the limit of 50,000"
    code, _, err = run(capsys, *READERS[reader]("/dev/zero", str(tiny_plan_path)))
    assert assert_one_line_error(code, err) == "/dev/zero: more than the limit of 50,000 characters"


def test_a_pipe_is_read_like_a_file_and_standard_input_stops_at_the_limit(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `--lengths <(cut ...)`: process substitution gives a pipe, not a regular file
    fifo = tmp_path / "lengths.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("100\n200\n", encoding="utf-8"))
    writer.start()
    code, out, err = run(capsys, "plan", *TINY, "--lengths", str(fifo), "--json")
    writer.join()
    assert code == 0, err
    assert json.loads(out)["input_lengths"] == [100, 200]
    monkeypatch.setattr("hydraplan.cost_models.profile_io.MAX_INPUT_FILE_BYTES", 64)
    monkeypatch.setattr("sys.stdin", io.StringIO("5\n" * 40))
    code, _, err = run(capsys, "plan", *TINY, "--lengths", "-")
    assert assert_one_line_error(code, err) == "standard input: more than the limit of 64 characters"


def test_non_utf8_bytes_in_a_lengths_file_say_where(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("100\n200\ncaf\xe9\n".encode("latin-1"))
    code, _, err = run(capsys, "plan", *TINY, "--lengths", str(path))
    assert assert_one_line_error(code, err) == f"{path}: not UTF-8 text (byte 0xe9 at offset 11); is it a binary file?"


def test_binary_standard_input_is_refused(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # as a C locale would give it: undecodable bytes escaped, not refused, by the interpreter
    stdin = io.TextIOWrapper(io.BytesIO(BINARY), encoding="utf-8", errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)
    code, _, err = run(capsys, "plan", *TINY, "--lengths", "-")
    assert assert_one_line_error(code, err) == f"standard input: {BINARY_MESSAGE}"


def test_a_directory_or_a_missing_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for argv in (["--lengths", str(tmp_path)], ["--profile", str(tmp_path)], ["--lengths", str(tmp_path / "nope")]):
        code, _, err = run(capsys, "plan", *TINY, *argv)
        assert assert_one_line_error(code, err).startswith(f"{argv[1]}"), argv


def test_a_very_long_bad_value_is_cut_to_one_readable_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path, "L.txt", "x" * 100_000 + "\n")
    code, _, err = run(capsys, "plan", *TINY, "--lengths", path)
    message = assert_one_line_error(code, err)
    assert message.startswith(f"{path} line 1: ") and len(message) <= 600


# ---------------------------------------------------------------------------------------------
# Values a flag's type refuses: one line, no usage block (issue 26)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["plan", "--num-gpus", "0"], "--num-gpus: '0' must be >= 1"),
        (["plan", "--time-limit-s", "0"], "--time-limit-s: '0' must be a finite number > 0 (or auto)"),
        (["plan", "--num-tokens", "many"], "--num-tokens: 'many' is not an integer"),
        (["plan", "--seed", "-1"], "--seed: '-1' must be >= 0"),
        (["plan", "--dp-sync-exposed", "2"], "--dp-sync-exposed: '2' must be in [0, 1]"),
        (["strategies", "--budget-s", "0"], "--budget-s: '0' must be > 0"),
        (["schemes", "--gpus-per-node", "0"], "--gpus-per-node: '0' must be >= 1"),
        (["whatif", "--seeds", "0"], "--seeds: '0' must be >= 1"),
        (["run", "--plan-time-limit-s", "soon"], "--plan-time-limit-s: 'soon' is neither a number of seconds"),
        (["serve", "--port", "0"], "--port: '0' must be >= 1"),
        (["plan", "--oversize", "ignore"], "--oversize: invalid choice: 'ignore'"),
    ],
)
def test_a_value_the_flag_refuses_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert out == "" and "usage:" not in err
    assert assert_one_line_error(code, err).startswith(f"argument {expected}"), err


@pytest.mark.parametrize(
    ("argv", "expected"), [(["plan", "--no-such-flag"], "unrecognized arguments: --no-such-flag"), ([], "required")]
)
def test_other_usage_errors_are_one_line_too(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert expected in assert_one_line_error(code, err)
