"""The run report's "spec and environment" section (torchjob.jobs.report): what the run
directory keeps of how the run was started, each part only when it is there: the launcher's
record (``.torchjob/RUN_ID/run.json``: backend, state, hosts, the exact command and the
environment it set), the newest checkpoint's trainer config and fingerprint, summary.json."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from html import escape
from typing import Any


def table(rows: list[tuple[str, Any]], name: str) -> str:
    """A two-column table of the rows whose value is known."""
    cells = "".join(f"<tr><th>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
                    for k, v in rows if v not in (None, "", [], {}))
    return f'<table data-table="{escape(name)}">{cells}</table>' if cells else ""


def part(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` when it is a mapping, else {} (a record of another version)."""
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def when(seconds: Any) -> str | None:
    if not isinstance(seconds, (int, float)):
        return None
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):  # NaN, or a time far out of range
        return str(seconds)


def launch(record: dict[str, Any]) -> str:
    """The launcher's record: the job, where it ran, the command and its environment."""
    request = part(record, "request")
    context, launcher = part(request, "context"), part(record, "launcher")
    found = record.get("nodes")
    nodes: list[Any] = found if isinstance(found, list) else []
    rows = [("handle", f"{record.get('backend')}:{record.get('id')}"),
            ("name", record.get("name")), ("state", record.get("state")),
            ("exit code", record.get("exit_code")), ("detail", record.get("detail")),
            ("created", when(record.get("created"))), ("ended", when(record.get("ended"))),
            ("job spec", context.get("source")), ("working directory", context.get("workdir")),
            ("python", context.get("python")), ("CPUs here", context.get("cpu_count")),
            ("launcher host", launcher.get("host")),
            ("node hosts", ", ".join(str(n.get("host")) for n in nodes if isinstance(n, dict)))]
    env = part(part(request, "data"), "env")
    out = "<h3>The job</h3>" + table(rows, "job")
    if request.get("text"):
        out += f'<h3>What ran</h3><pre data-table="command">{escape(str(request["text"]))}</pre>'
    if env:
        out += "<h3>Environment set for the workers</h3>" + table(sorted(env.items()), "env")
    return out


def checkpoint(manifest: dict[str, Any]) -> str:
    """The newest checkpoint: its place, fingerprint and the whole trainer config."""
    config, position = part(manifest, "config"), part(manifest, "position")
    rows = [("fingerprint", manifest.get("fingerprint")),
            ("world size", manifest.get("world_size")), ("layout", manifest.get("layout")),
            ("position", ", ".join(f"{k} {v}" for k, v in position.items()))]
    return ("<h3>Newest checkpoint and trainer config</h3>" + table(rows, "checkpoint")
            + table(sorted((str(k), json.dumps(v) if isinstance(v, (dict, list)) else v)
                           for k, v in config.items()), "trainer-config"))


def setup_section(record: dict[str, Any], manifest: dict[str, Any],
                  summary: dict[str, Any]) -> str:
    """The whole section; says so when the run directory keeps none of it."""
    parts = [launch(record) if record else "", checkpoint(manifest) if manifest else ""]
    if summary:
        parts.append("<details><summary>summary.json</summary><pre data-table=\"summary\">"
                     f"{escape(json.dumps(summary, indent=1, default=str))}</pre></details>")
    if not any(parts):
        return ('<p class="empty" data-empty="setup">The run directory keeps no record of '
                "its launch (.torchjob/), no checkpoint and no summary.json.</p>")
    return "".join(parts)
