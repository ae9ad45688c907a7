"""What kubectl and the kubelet make of a rendered manifest: what the container sees is what
the user wrote. Every manifest is read back with two YAML 1.1 readers, kubectl's (go-yaml v2's
resolution, ``tests/k8s/goyaml.py``) and PyYAML's, and its commands and env values are expanded
by a port of the kubelet's ``$(VAR)`` rule (``tests/k8s/kubelet.py``, an EMULATOR: no kubelet
runs here) with every variable defined, in its current and its older (bytewise) version.
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchjob.jobs.backend import Context
from torchjob.jobs.spec import JobSpec, K8s, TrainerSection
from torchjob.jobs.values import FrozenMap, Nnodes
from torchjob.k8s.backend import K8sBackend
from torchjob.k8s.render import render_manifest, render_objects
from torchjob.k8s.validate import SECRET_VALUE
from torchjob.k8s.yaml import GO_YAML_V2, dump, quoted, read_manifests
from tests.k8s.goyaml import Timestamp, go_resolve, load_all
from tests.k8s.kubelet import Everything, expand

# Plain scalars that YAML 1.1 readers take for something else (go-yaml v2 and/or PyYAML).
SPECIAL = ["y", "Y", "n", "N", "yes", "No", "ON", "off", "true", "False", "null", "Null", "~",
           "", "1e-05", "1e5", "2e-5", ".5", "1.", "-.5", "+1", "0o17", "0x1F", "017", "0b101",
           "-0b1", "1_000", "99999999999999999999", "1:30", "190:20:30.15", ".inf", "-.Inf",
           ".NaN", "2024-1-2", "2001-12-14t21:59:43.10-05:00", "2002-12-14", "=", "<<", "0",
           "-0", "12", "3.0"]
HOSTILE = ["$(HOME)", "$$", "$$(X)", "$", "a$", "$(", "$(x", "$)", "$é", "$\U0001f600", "${A}",
           "$$$(A)", "'", '"', "a: b", "- x", "# c", "{a: 1}", "[1]", "|", ">", "!tag", "&a",
           "*a", "%x", "@x", "`x`", "new\nline", "trail\n", "\n", " lead", "trail ", "tab\t",
           "caf\u00e9 \u65e5\u672c", "\u2028", "\x85", "\ufeff", "lr=2e-5", "--lr=1e-5"]
WORD = st.one_of(st.sampled_from(SPECIAL + HOSTILE),
                 st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"),
                         max_size=12),
                 st.lists(st.sampled_from(SPECIAL + HOSTILE + ["x", " ", "$", "("]),
                          max_size=4).map("".join))
NAME = st.one_of(st.sampled_from(["y", "n", "yes", "no", "on", "off", "true", "null", "e1",
                                  "inf", "nan"]),
                 st.from_regex(r"[a-z]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True))
ENV_NAME = st.one_of(st.sampled_from(["Y", "N", "NO", "ON", "OFF", "NULL", "TRUE", "E", "_1"]),
                     st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True)
                     ).filter(lambda n: not re.search(r"KEY|SECRET|TOKEN|PASS|CRED|PRIVATE|"
                                                      r"^PET_|^TORCH|RANK|WORLD|MASTER_", n))
SCRIPT = st.one_of(st.sampled_from(["y", "1e-05", "0o17", "$(HOME)/t.py", "a b.py", "é.py"]),
                   st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1,
                           max_size=12)).filter(lambda s: not s.startswith("-"))
TARGETS = [("pytorchjob", "2"), ("pytorchjob", "1:2"), ("trainjob", "2")]


def spec_of(name: str, script: str, args: list[str], env: dict[str, str],
            nnodes: str) -> JobSpec:
    return JobSpec(name=name, nnodes=Nnodes.parse(nnodes, "nnodes"), env=FrozenMap(env),
                   trainer=TrainerSection(script=script, args=tuple(args)),
                   k8s=K8s(pvc="runs"))  # several nodes: checkpoints on a shared claim


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers (and TrainJob's trainer) whose command and env the kubelet expands."""
    found: list[dict[str, Any]] = []

    def walk(node: Any, key: str = "") -> None:
        if isinstance(node, dict):
            if key in ("trainer",) or ("image" in node and "command" in node):
                found.append(node)
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
    walk(obj)
    return found


def seen_by_container(container: dict[str, Any], bytewise: bool) -> tuple[list[str],
                                                                          dict[str, str]]:
    """(argv, plain env) as the kubelet starts the container, every variable defined."""
    defined = Everything()
    argv = [expand(w, defined, bytewise=bytewise)
            for w in container.get("command", []) + container.get("args", [])]
    env = {e["name"]: expand(e["value"], defined, bytewise=bytewise)
           for e in container.get("env", []) if "value" in e}
    return argv, env


def same_everywhere(text: str, objs: list[dict[str, Any]]) -> None:
    """Both readers give back exactly the objects (types included), and submit sends them."""
    for read in (load_all(text), list(yaml.safe_load_all(text)), read_manifests(text)):
        assert read == objs
        assert _types(read) == _types(objs)


def _types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _types(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_types(v) for v in node]
    return type(node).__name__


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=NAME, script=SCRIPT, args=st.lists(WORD, max_size=6),
       env=st.dictionaries(ENV_NAME, WORD, max_size=5))
def test_the_container_sees_what_the_user_wrote(name: str, script: str, args: list[str],
                                                env: dict[str, str]) -> None:
    env = {k: v for k, v in env.items() if not SECRET_VALUE.search(v)}
    for target, nnodes in TARGETS:
        spec = spec_of(name, script, args, env, nnodes)
        objs = render_objects(spec, target)
        text = render_manifest(spec, target)
        same_everywhere(text, objs)
        job = load_all(text)[0]
        for container in containers(job):
            for bytewise in (False, True):
                argv, seen = seen_by_container(container, bytewise)
                assert argv[-len(args) - 1:] == [script, *args]
                assert {k: seen[k] for k in env} == env


@pytest.mark.parametrize("word", SPECIAL)
def test_special_words_are_quoted_and_read_back_as_strings(word: str) -> None:
    """The readers have teeth (plain, each word is not a string to one of them), and the
    emitter quotes each word, in a value and in a key."""
    if word in ("=", "<<"):  # YAML 1.1's value and merge keys: PyYAML refuses them plain
        with pytest.raises(yaml.YAMLError):
            yaml.safe_load(f"{word}: {word}")
    else:
        plain_go, plain_py = go_resolve(word), yaml.safe_load(f"k: {word}")["k"]
        assert type(plain_go) is not str or type(plain_py) is not str or \
            isinstance(plain_go, Timestamp), word
    assert quoted(word)
    doc = {word: [word, {"value": word}]}
    assert load_all(dump(doc)) == [doc] == list(yaml.safe_load_all(dump(doc)))


def test_ordinary_strings_stay_plain() -> None:
    for word in ("hello", "4Gi", "500m", "lr=2e-5", "12e", "0x", "python", "-m", "--lr",
                 "kueue.x-k8s.io/queue-name", "job-master-0:29400", "é"):
        assert not quoted(word), word
        assert load_all(dump({"k": word})) == [{"k": word}]


def test_the_go_rules_cover_what_go_yaml_resolves() -> None:
    """Every non-string that the go-yaml v2 port resolves among many candidates is quoted."""
    candidates = SPECIAL + [f"{s}{d}{e}" for s in ("", "-", "+") for d in
                            ("0", "1", "08", "0x1g", "1_", "_1", ".", "1.5", "0o8", "0B1")
                            for e in ("", "e3", "E-2", "e")]
    for word in candidates:
        if not isinstance(go_resolve(word), str) or isinstance(go_resolve(word), Timestamp):
            assert quoted(word), word
    assert len(GO_YAML_V2) >= 8


def test_submit_sends_what_render_printed() -> None:
    """The Request's text is the one emitter's; submit reads its objects back from it."""
    spec = spec_of("y", "t.py", ["n", "1e-05", "$(HOME)"], {"N": "0o17", "Y": "$$"}, "1:2")
    request = K8sBackend("pytorchjob").render(spec, Context(run_id="r"))
    assert read_manifests(request.text) == request.data == load_all(request.text)
    assert "name: 'y'" in request.text and "'1e-05'" in request.text


@settings(max_examples=15, deadline=None)
@given(args=st.lists(WORD, max_size=4), value=WORD)
def test_torchx_component_strings_survive_torchx_the_kubelet_and_bash(args: list[str],
                                                                      value: str) -> None:
    """``torchx run -s kubernetes jobs/backends/torchx/components.py:train``: the component cannot know the
    scheduler, so its script is immune to the kubelet (render.shell_word) and the env goes
    into the script. TorchX's own macro substitution (``macros.Values.apply``), then the
    kubelet (emulated), then bash (real) give back the user's words."""
    from torchx import specs

    from torchjob.jobs.backends.torchx.components import train
    role = train("--note", *args, j="2x1", name="digits", script="t.py",
                 env={"NOTE": value}).roles[0]
    role = specs.macros.Values(img_root="", app_id="app", replica_id="0",
                               rank0_env="TORCHX_RANK0_HOST").apply(role)
    script = expand(role.args[1], Everything())
    assert expand(script, Everything(), bytewise=True) == script
    words = subprocess.run(["bash", "-c", f"set -- {script}; printf '%s\\0' \"$@\""],
                           capture_output=True, check=True,
                           env={"TORCHX_RANK0_HOST": "host0", "PATH": "/usr/bin:/bin"}
                           ).stdout.decode().split("\0")[:-1]
    assert words[:2] == ["env", f"NOTE={value}"]
    assert words[-len(args) - 2:] == ["t.py", "--note", *args]
    assert f"host0:{29400}" in words
