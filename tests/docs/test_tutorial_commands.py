"""Every command of the tutorials' ```bash blocks is one the suite runs end to end elsewhere (ALLOWED names
the test), or its block carries a visible reason it cannot run here, right before it:

    > Not run by the test suite: <why> ...

``make`` targets that take minutes are held by the test that runs the same stack, flow and recipe
(``make demo`` is ``odl stack up`` then ``odl watch odl/full``, which tests/e2e/test_stack.py runs)."""

from __future__ import annotations

import re

from tasks.paths import PROJECT_ROOT

TUTORIALS = PROJECT_ROOT / "docs" / "tutorials"
MARK = re.compile(r"^> Not run by the test suite: \S.{10,}", re.M)

# command as typed (without .venv/bin/ and its comment) -> "test file::test function" that runs it
ALLOWED = {
    "make demo": "tests/e2e/test_stack.py::test_the_watch_prints_a_few_readable_lines",
    "make down": "tests/e2e/test_stack.py::test_report_renders_in_the_prefect_ui",
    "odl prepare recipes/digits.toml --out out/digits":
        "tests/stages/test_rehearse.py::test_a_rate_that_diverges_on_held_out_data_is_one_warning_line",
    "odl run recipes/digits.toml --board vboard":
        "tests/cli/test_quiet_output.py::test_odl_run_of_a_thousand_steps_into_a_file_is_under_60_lines",
    "odl flow recipes/digits.toml --board vboard":
        "tests/cli/test_quiet_output.py::test_odl_flow_of_a_thousand_steps_prints_its_summary_once",
    "odl registry digits vboard":
        "tests/cli/test_registry_listing.py::test_each_version_is_a_line_under_160_characters_with_its_details_after",
    "odl rollback digits vboard":
        "tests/flow/test_nightly.py::test_nightly_cycles_promote_reject_rollout_and_rollback",
    "make nightly": "tests/flow/test_nightly.py::test_nightly_cycles_promote_reject_rollout_and_rollback",
    "make teacher": "tests/flow/teacher_nights.py::test_a_teacher_labels_two_nights_of_unlabeled_board_data",
    "odl board up --name nat1 --pull": "tests/e2e/test_pull_board.py::test_nothing_reaches_the_board_from_outside",
    "odl board list": "tests/e2e/test_pull_board.py::test_odl_full_promotes_through_pull_mode",
    "cd ~/odl/agent": "tests/e2e/test_pull_board.py::test_the_tutorials_board_commands_enrol_a_board_and_check_in",
    "python3 -m device_agent --root ~/odl enrol --endpoint <ENDPOINT> --pin <PIN> --name <NAME> --code <CODE>":
        "tests/e2e/test_pull_board.py::test_the_tutorials_board_commands_enrol_a_board_and_check_in",
    "python3 -m device_agent --root ~/odl pull --once":
        "tests/e2e/test_pull_board.py::test_the_tutorials_board_commands_enrol_a_board_and_check_in",
    "make fleet":
        "tests/fleet/test_fleet_flow.py::test_rounds_average_what_the_boards_sent_and_go_on_without_a_failed_board",
}  # fmt: skip


def _blocks() -> list[tuple[str, str, bool]]:
    """(page, block text, marked) of every ```bash block of the tutorials."""
    out = []
    for page in sorted(TUTORIALS.glob("*.md")):
        text = page.read_text()
        for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M):
            before = text[: m.start()].rstrip("\n").split("\n\n")[-1]
            out.append((page.name, m.group(1), bool(MARK.match(before))))
    return out


def _commands(block: str) -> list[str]:
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.splitlines()]
    return [
        " ".join(line.removeprefix(".venv/bin/").split())
        for line in lines
        if line and not line.startswith("#")
    ]


def test_every_tutorial_command_runs_in_a_test_or_says_why_not() -> None:
    blocks = _blocks()
    assert len(blocks) >= 7
    loose = [
        f"{page}: {command}"
        for page, block, marked in blocks
        if not marked
        for command in _commands(block)
        if command not in ALLOWED
    ]
    assert not loose, f"add each to ALLOWED with the test that runs it, or mark its block: {loose}"


def test_each_allowed_command_names_a_test_that_exists() -> None:
    for command, where in ALLOWED.items():
        path, _, name = where.partition("::")
        source = (PROJECT_ROOT / path).read_text()
        assert re.search(rf"^def {name}\(", source, re.M), (command, where)


def test_each_allowed_command_is_in_a_tutorial() -> None:
    used = {c for _, block, _ in _blocks() for c in _commands(block)}
    assert set(ALLOWED) <= used, set(ALLOWED) - used
