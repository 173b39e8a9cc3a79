"""Where the stack's automations send their alerts: a Prefect notification block, set once.

``odl stack notify --webhook URL`` (or ``ODL_ALERT_WEBHOOK`` when ``odl stack up`` runs) keeps the
URL in ``$ODL_HOME/stack.json`` and writes it into the block ``custom-webhook/odl-alerts`` (a JSON
POST of ``{"subject", "body"}``); ``--block TYPE/NAME`` names an existing notification block instead
(Slack, e-mail, ...: made in the UI's Blocks page). The automations (:mod:`tasks.stack.automations`)
then send to that block; with none set none is installed and :func:`line` says so. All through
the server's REST API (:func:`tasks.stack.ownership.api`), no Prefect import."""

from __future__ import annotations

import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from tasks.stack import StackError
from tasks.stack.ownership import api, stack_config, update_stack_config

WEBHOOK_BLOCK = "custom-webhook/odl-alerts"  # the block a --webhook setting is written into
ENV_WEBHOOK = "ODL_ALERT_WEBHOOK"
HINT = "odl stack notify --webhook URL"
NONE_SET = f"no notification set: {HINT}"  # the automations' description says so


@dataclass(frozen=True)
class Target:
    """The notification block the automations send to (``block_id`` None: nowhere, ``why`` says)."""

    block_id: str | None
    why: str


def setting(home: Path) -> dict[str, str]:
    """The recorded alert setting of ``home``: ``{"webhook": URL}``, ``{"block": TYPE/NAME}`` or {}."""
    value = stack_config(home).get("alerts")
    return value if isinstance(value, dict) else {}


def record(home: Path, webhook: str | None = None, block: str | None = None) -> dict[str, str]:
    """Check and keep the setting in ``stack.json`` (neither given: alerts off); the new setting."""
    if webhook is not None:
        value = {"webhook": check_webhook(webhook)}
    elif block is not None:
        value = {"block": check_block_name(block)}
    else:
        value = {}
    update_stack_config(home, alerts=value, alerts_installed=None)  # installed again by up or notify
    return value


def check_webhook(url: str) -> str:
    """``url`` when it is an http(s) address with a host, else StackError naming it."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StackError(f"--webhook {url!r}: expected an http:// or https:// address with a host")
    return url.strip()


def check_block_name(block: str) -> str:
    """``block`` when it reads ``TYPE/NAME`` (a block type's slug and a block's name), else StackError."""
    slug, _, name = block.strip().partition("/")
    if not slug or not name or "/" in name:
        raise StackError(
            f"--block {block!r}: expected TYPE/NAME of a notification block, e.g. slack-webhook/team"
        )
    return f"{slug}/{name}"


def from_environment(env: dict[str, str]) -> None:
    """Record ``ODL_ALERT_WEBHOOK`` (when set and not already the setting) for ``odl stack up``."""
    url = env.get(ENV_WEBHOOK, "").strip()
    if url and setting(Path(env["ODL_HOME"])) != {"webhook": url}:
        record(Path(env["ODL_HOME"]), webhook=url)


def resolve(env: dict[str, str]) -> Target:
    """The block the recorded setting names on the stack's server (the webhook's block written or
    updated first); a named block that is missing or cannot notify is a Target to nowhere."""
    value = setting(Path(env["ODL_HOME"]))
    if value.get("webhook"):
        why = f"alerts: POST to {shown(value['webhook'])} (block {WEBHOOK_BLOCK})"
        return Target(write_webhook_block(env, value["webhook"]), why)
    if not value.get("block"):
        return Target(None, NONE_SET)
    found = find_block(env, value["block"])
    if found is None:
        return Target(
            None, f"block {value['block']} not found on the server: odl stack notify --block TYPE/NAME"
        )
    if "notify" not in (found.get("block_schema") or {}).get("capabilities", []):
        return Target(
            None, f"block {value['block']} cannot send notifications: odl stack notify --block TYPE/NAME"
        )
    return Target(found["id"], f"alerts: to the block {value['block']}")


def find_block(env: dict[str, str], block: str) -> dict | None:
    """The block document ``TYPE/NAME`` on the server, or None."""
    slug, _, name = block.partition("/")
    path = f"/block_types/slug/{urllib.parse.quote(slug)}/block_documents/name/{urllib.parse.quote(name)}"
    try:
        found = api(env, "GET", path)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise StackError(f"cannot read the block {block} from the Prefect server: {exc}") from exc
    return found if isinstance(found, dict) else None


def webhook_data(url: str) -> dict:
    """The ``custom-webhook`` block's fields: a JSON POST of the subject and body to ``url``."""
    return {
        "name": "odl alerts",
        "url": url,
        "method": "POST",
        "json_data": {"subject": "{{subject}}", "body": "{{body}}"},
        "timeout": 10,
        "allow_private_urls": True,
        "secrets": {},
    }


def write_webhook_block(env: dict[str, str], url: str) -> str:
    """Create or update the block :data:`WEBHOOK_BLOCK` posting to ``url``; its id."""
    found = find_block(env, WEBHOOK_BLOCK)
    if found is not None:
        api(
            env,
            "PATCH",
            f"/block_documents/{found['id']}",
            {"data": webhook_data(url), "merge_existing_data": False},
        )
        return found["id"]
    slug, _, name = WEBHOOK_BLOCK.partition("/")
    block_type = api(env, "GET", f"/block_types/slug/{slug}")
    schemas = api(
        env,
        "POST",
        "/block_schemas/filter",
        {"block_schemas": {"block_type_id": {"any_": [block_type["id"]]}}},
    )
    if not schemas:
        raise StackError(f"the Prefect server knows no schema of the block type {slug}")
    body = {
        "name": name,
        "block_type_id": block_type["id"],
        "block_schema_id": schemas[0]["id"],
        "data": webhook_data(url),
    }
    return api(env, "POST", "/block_documents/", body)["id"]


def shown(url: str) -> str:
    """``url`` as a message shows it: scheme, host and port only (a webhook's path is often its key)."""
    parts = urllib.parse.urlsplit(url)
    return (
        f"{parts.scheme}://{parts.netloc}/…" if parts.path.strip("/") else f"{parts.scheme}://{parts.netloc}"
    )


def line(target: Target) -> str:
    """One line saying where ``target`` sends alerts, or that they go nowhere and why."""
    if target.block_id:
        return target.why
    return (
        f"alerts go nowhere until one is set: {HINT}"
        if target.why == NONE_SET
        else f"alerts go nowhere: {target.why}"
    )


def status_line(home: Path) -> str:
    """One line for ``odl stack up`` and ``status``: where the installed automations send alerts
    (recorded by the last install), else the setting waiting for the next ``odl stack up``."""
    config = stack_config(home)
    if config.get("alerts_installed"):
        return str(config["alerts_installed"])
    value = setting(home)
    if not value:
        return line(Target(None, NONE_SET))
    where = f"POST to {shown(value['webhook'])}" if value.get("webhook") else f"the block {value['block']}"
    return f"alerts: {where}, from the next odl stack up"
