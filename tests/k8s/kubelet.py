"""An EMULATOR of the kubelet's ``$(VAR)`` expansion (no kubelet runs here): a line-by-line
port of k8s.io/kubernetes ``third_party/forked/golang/expansion/expand.go``, which the kubelet
applies to a container's command, args and env values (kubelet_pods.go). It works on the UTF-8
bytes, as Go does. ``$$`` is ``$``; ``$(NAME)`` is the variable's value when it is defined,
else left as written; a ``$(`` with no ``)`` after it, and any other ``$``, stay.

``bytewise=True`` is the older expand.go (before ``utf8.DecodeRuneInString``), which wrote the
byte after a lone ``$`` as ``string(byte)``: a multi-byte character after ``$`` came out
garbled. An escaped string must come through both versions unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping

OPERATOR, OPENER, CLOSER = ord("$"), ord("("), ord(")")
RUNE_ERROR = "\ufffd".encode()


def _decode_rune(data: bytes) -> tuple[bytes, int]:
    """Go's ``utf8.DecodeRuneInString``: the first character's bytes and its size; an invalid
    byte is one byte, written back as U+FFFD."""
    for size in (1, 2, 3, 4):
        try:
            data[:size].decode("utf-8")
        except UnicodeDecodeError:
            continue
        return data[:size], size
    return RUNE_ERROR, 1


def _try_read_variable_name(data: bytes, bytewise: bool) -> tuple[bytes, bool, int]:
    """expand.go's ``tryReadVariableName``: (what was read, is it a variable name, bytes
    consumed); ``data`` starts after the operator."""
    if bytewise:
        rune, size = chr(data[0]).encode(), 1  # Go's string(byte): the byte as a code point
    else:
        rune, size = _decode_rune(data)
    if data[0] == OPERATOR:
        return data[0:size], False, size  # escaped operator
    if data[0] == OPENER:
        for i in range(1, len(data)):
            if data[i] == CLOSER:
                return data[1:i], True, i + 1
        return b"$(", False, 1  # incomplete reference
    return b"$" + rune, False, size


def expand(text: str, env: Mapping[str, str], *, bytewise: bool = False) -> str:
    """``text`` as the container sees it, with ``env`` the variables defined for it
    (expand.go's ``Expand`` with ``MappingFuncFor(env)``)."""
    data = text.encode("utf-8", "surrogatepass")
    out = bytearray()
    checkpoint = 0
    cursor = 0
    while cursor < len(data):
        if data[cursor] == OPERATOR and cursor + 1 < len(data):
            out += data[checkpoint:cursor]
            read, is_var, advance = _try_read_variable_name(data[cursor + 1:], bytewise)
            if is_var:
                name = read.decode("utf-8", "surrogatepass")
                out += (env[name] if name in env else f"$({name})").encode("utf-8",
                                                                            "surrogatepass")
            else:
                out += read
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return (bytes(out) + data[checkpoint:]).decode("utf-8", "surrogatepass")


class Everything(dict[str, str]):
    """Every variable defined (as ``<NAME>``): a reference left unescaped shows up."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> str:
        return f"<{name}>"
