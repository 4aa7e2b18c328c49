"""Names that came over the network, made printable where they enter: node names (a label
anyone on a node can set), addresses someone typed, a target's host.
"""

from __future__ import annotations

MAX_NAME_CHARS = 253  # a DNS name's most


def host_of(instance: str) -> str:
    """A node's name from a Prometheus `instance` (`node1:9400`, `[fd00::1]:9400`): its
    host, so that it names the machine as `ssh` takes it."""
    host, colon, port = instance.rpartition(":")
    if not colon or not port.isdigit():
        return instance
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def node_text(text: str) -> str:
    """A node's name as every view prints it: `safe_name`, and also with whitespace and a
    leading `-` escaped, so that its first word is all of it and no command (`ssh`)
    takes it for an option."""
    shown = safe_name(text)
    # Every whitespace character but the space is unprintable, escaped by `safe_name`.
    if " " not in shown and shown[:1] != "-":
        return shown
    escaped = "".join(_escape(ch) if ch.isspace() else ch for ch in shown)
    return _escape("-") + escaped[1:] if escaped[:1] == "-" else escaped


def safe_name(text: str) -> str:
    """`text` with every character a terminal would act on escaped (`\\x1b`), and cut to
    a DNS name's length: node names come from labels anyone on a node can set."""
    cut = text[:MAX_NAME_CHARS]
    if cut.isprintable() and cut.strip() == cut and cut:
        return cut
    escaped = "".join(ch if ch.isprintable() and ch != "\\" else _escape(ch) for ch in cut)
    return escaped.strip() or "(unnamed)"


def shown_address(text: str) -> str:
    """An address someone typed, safe to print: escaped, and any `user:password@` hidden."""
    scheme, sep, rest = text.rpartition("://")
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return safe_name(f"{scheme}{sep}{netloc}{slash}{path}")


def _escape(ch: str) -> str:
    code = ord(ch)
    return "\\\\" if ch == "\\" else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
