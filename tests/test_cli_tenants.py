"""`tenants`, `--tenant`, `enqueue --priority`, `agents limit`, `ratelimits` as an
operator drives them, and their bad input: one line, the documented exit code."""

from __future__ import annotations

import json

from tests.test_cli import cli


def test_tenants_scope_every_command_and_bad_input_gets_a_clear_error(dsn: str) -> None:
    tid = cli(dsn, "tenants", "create", "acme", "--max-running", "2", "--json").stdout
    acme = json.loads(tid)["tenant_id"]
    cli(dsn, "agents", "create", "--tenant", "acme", "--name", "bot", "--model", "m")
    cli(dsn, "agents", "limit", "--tenant", "acme", "bot", "--max-running", "1")
    out = cli(
        dsn,
        "enqueue",
        "--tenant",
        acme,
        "--agent",
        "bot",
        "--input",
        "hi",
        "--priority",
        "7",
        "--json",
    ).stdout
    run_id = json.loads(out)["run_id"]
    shown = json.loads(cli(dsn, "runs", "show", "--tenant", "acme", run_id, "--json").stdout)
    assert shown["priority"] == 7 and shown["tenant_id"] == acme
    # the default tenant neither sees acme's agent nor its run
    assert json.loads(cli(dsn, "runs", "list", "--json").stdout) == []
    p = cli(dsn, "runs", "show", run_id, ok=False)
    assert p.returncode == 3 and "no run" in p.stderr
    listed = {t["name"]: t for t in json.loads(cli(dsn, "tenants", "list", "--json").stdout)}
    assert listed["acme"]["max_running"] == 2 and listed["acme"]["queued"] == 1
    assert "default" in listed
    set_ = json.loads(
        cli(dsn, "tenants", "set", "acme", "--weight", "3", "--no-limit", "--json").stdout
    )
    assert set_["weight"] == 3 and set_["max_running"] is None
    for args, code, words in [
        (("enqueue", "--agent", "bot", "--input", "x", "--priority", "-1"), 2, "out of range"),
        (("enqueue", "--tenant", "nosuch", "--agent", "bot", "--input", "x"), 3, "no tenant"),
        (("tenants", "create", "acme"), 4, "already exists"),
        (("tenants", "set", "acme", "--max-running", "-1"), 2, "out of range"),
        (("tenants", "set", "ghost", "--weight", "2"), 3, "no tenant 'ghost'"),
        (("tenants", "create", "w", "--weight", "0"), 2, "out of range"),
        (("ratelimits", "set", "anthropic"), 2, "give at least one limit"),
        (("ratelimits", "set", "anthropic", "--rpm", "0"), 2, "out of range"),
        (("ratelimits", "rm", "nope"), 3, "no rate limit 'nope'"),
    ]:
        p = cli(dsn, *args, ok=False)
        assert p.returncode == code and words in p.stderr, (args, p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    cli(dsn, "ratelimits", "set", "anthropic", "--rpm", "50", "--output-tpm", "8000")
    (rl,) = json.loads(cli(dsn, "ratelimits", "list", "--json").stdout)
    assert rl["requests_per_minute"] == 50 and rl["output_tokens_per_minute"] == 8000
    assert rl["input_tokens_per_minute"] is None
