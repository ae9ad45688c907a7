"""An EMULATOR of the kubelet's ``$(VAR)`` expansion (no kubelet runs here): the rule of
k8s.io/kubernetes third_party/forked/golang/expansion/expand.go, which the kubelet applies to
a container's command, args and env values. ``$$`` is ``$``; ``$(NAME)`` is the variable's
value when it is defined, else left as written; any other ``$`` stays."""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    """``text`` as the container sees it, with ``env`` the variables defined for it."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
        elif text[i + 1] == "$":
            out.append("$")
            i += 2
        elif text[i + 1] == "(" and (end := text.find(")", i + 2)) >= 0:
            name = text[i + 2:end]
            out.append(env[name] if name in env else f"$({name})")
            i = end + 1
        else:
            out.append(text[i:i + 2])
            i += 2
    return "".join(out)


class Everything(dict[str, str]):
    """Every variable defined (as ``<NAME>``): a reference left unescaped shows up."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> str:
        return f"<{name}>"
