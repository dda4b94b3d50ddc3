"""btj reads a manifest as kubectl 1.35 sends it: each case against the real kubectl, offline.

`kubectl label --local -f FILE -o json` reads the file with kubectl's own decoder (sigs.k8s.io/yaml over
go-yaml v2, the path `kubectl apply` and `create` take), changes nothing with `zz-` (removing a label
that is not there) and prints the object it would send, without a server. Each case also records what
kubectl 1.35.2 printed, so the cases hold where the binary is missing (it is fetched into .tools/ by
scripts/bootstrap.sh; CI=true makes its absence a failure).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from blackwell_operator.admission import InputError, decode, load_documents
from blackwell_operator.cli import _register_commands, app

ROOT = Path(__file__).resolve().parents[2]
HEAD = "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\nmetadata: {name: job}\n"
BTJ_SPEC = "spec:\n  model: {preset: llama3.1-8b}\n  cluster: {instanceType: ml.p6-b200.48xlarge, nodes: 1}\n"


class Refused:
    """kubectl refuses the file; btj's one line says `btj` and kubectl's error says `kubectl`."""

    def __init__(self, btj: str, kubectl: str) -> None:
        self.btj, self.kubectl = btj, kubectl


# case -> (the file's bytes, the spec kubectl 1.35.2 sends, or how both refuse it)
CASES: dict[str, tuple[bytes, Any]] = {
    "merge-key": (
        b"base: &c {instanceType: ml.p6-b200.48xlarge, nodes: 2}\n"
        b"spec:\n  cluster:\n    <<: *c\n    nodes: 4\n",
        {"cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 4}},
    ),
    "merge-list-earlier-wins": (
        b"spec:\n  x: &a {p: 1, q: 2}\n  w: &b {q: 3, r: 4}\n  z:\n    <<: [*a, *b]\n    s: 5\n",
        {"x": {"p": 1, "q": 2}, "w": {"q": 3, "r": 4}, "z": {"p": 1, "q": 2, "r": 4, "s": 5}},
    ),
    # go-yaml v2 applies a merge where it stands: it overrides the keys written before it.
    "merge-after-a-key-overrides-it": (b"spec: {a: 1, <<: {a: 2, b: 3}, b: 4}\n", {"a": 2, "b": 4}),
    "merge-quoted-is-a-key": (b'spec: {"<<": {c: 1}, d: <<}\n', {"<<": {"c": 1}, "d": "<<"}),
    "merge-of-a-list-of-numbers": (
        b"spec: {<<: [1]}\n",
        Refused("a merge (<<) needs a mapping", "map merge requires map"),
    ),
    "numbers": (
        b"spec: {a: 1e3, b: 8192.0, c: 12e03, d: 1E3, e: 3., f: -.5, g: +12, h: 1_000, i: 0x1F, "
        b"j: 0o17, k: 017, l: 08, m: 0b101, n2: -0b11, o: 1.0e+3, p: 0.000001, q: 1e21, r: -0.0, "
        b"s: 1_0.5, t: .5_0, u: ._5, v: 1._5, w: _1}\n",
        {
            "a": 1000,
            "b": 8192,
            "c": 12000,
            "d": 1000,
            "e": 3,
            "f": -0.5,
            "g": 12,
            "h": 1000,
            "i": 31,
            "j": 15,
            "k": 15,
            "l": 8,
            "m": 5,
            "n2": -3,
            "o": 1000,
            "p": 1e-06,
            "q": 1e21,
            "r": 0,
            "s": 10.5,
            "t": 0.5,
            "u": "._5",
            "v": 1.5,
            "w": "_1",
        },
    ),
    "whole-floats-fill-integer-fields": (
        (
            HEAD
            + "spec:\n  model: {preset: llama3.1-8b}\n  cluster: {nodes: 2.0}\n  training: {steps: 1e3}\n"
        ).encode(),
        {"model": {"preset": "llama3.1-8b"}, "cluster": {"nodes": 2}, "training": {"steps": 1000}},
    ),
    "beyond-int64": (
        b"spec: {a: 9223372036854775807, b: 9223372036854775808, c: 18446744073709551615, "
        b"d: 99999999999999999999, e: 1e400, f: 0x8000000000000000}\n",
        {
            "a": 9223372036854775807,
            "b": 9223372036854775808.0,
            "c": 18446744073709551615.0,
            "d": 1e20,
            "e": "1e400",
            "f": 9223372036854775808.0,
        },
    ),
    "yaml-1.1-booleans": (
        b"spec: {a: y, b: n, c: yes, d: NO, e: on, f: Off, g: True, h: Y, i: N, j: oN, k: 'y'}\n",
        {
            "a": True,
            "b": False,
            "c": True,
            "d": False,
            "e": True,
            "f": False,
            "g": True,
            "h": True,
            "i": False,
            "j": "oN",
            "k": "y",
        },
    ),
    "nulls-timestamps-and-sexagesimals": (
        b"spec: {a: ~, b: null, c: , d: 2026-01-01, e: 2001-12-14t21:59:43.10-05:00, f: 1:20, "
        b"g: 190:20:30.15, h: =}\n",
        {
            "a": None,
            "b": None,
            "c": None,
            "d": "2026-01-01",
            "e": "2001-12-14t21:59:43.10-05:00",
            "f": "1:20",
            "g": "190:20:30.15",
            "h": "=",
        },
    ),
    "tags": (
        b"spec: {a: !!binary aGVsbG8=, b: !!str 12, c: !!int '7', d: !!float 3, e: !foo bar, f: ! 12, "
        b"g: !!timestamp 2001-01-01, h: !!set {x, y}}\n",
        {
            "a": "hello",
            "b": "12",
            "c": 7,
            "d": 3,
            "e": "bar",
            "f": "12",
            "g": "2001-01-01",
            "h": {"x": None, "true": None},
        },
    ),
    # Go's JSON encoder writes one U+FFFD per byte of a decoded !!binary that is not UTF-8.
    "binary-not-utf-8": (b"spec: {a: !!binary ceKCeA==}\n", {"a": "q\ufffd\ufffdx"}),
    "tag-that-does-not-fit": (
        b"spec: {a: !!int 3.5}\n",
        Refused("cannot decode !!float `3.5` as a !!int", "cannot decode !!float `3.5` as a !!int"),
    ),
    "keys-become-strings": (
        b"spec: {1: a, true: b, 1.5: c, 1e3: d, 0x10: e, y: f, 1e6: g, 123456789.0: h, 0.1: i, n: j}\n",
        {
            "1": "a",
            "true": "f",
            "1.5": "c",
            "1000": "d",
            "16": "e",
            "1e+06": "g",
            "1.2345679e+08": "h",
            "0.1": "i",
            "false": "j",
        },
    ),
    "null-key": (b"spec: {~: a}\n", Refused("a null key", "unsupported map key")),
    "uint64-key": (b"spec: {18446744073709551615: a}\n", Refused("beyond int64", "unsupported map key")),
    "list-key": (b"spec: {[1]: a}\n", Refused("cannot be a key", "invalid map key")),
    "recursive-alias": (b"spec: &a {b: *a}\n", Refused("alias of itself", "contains itself")),
    "not-a-number": (b"spec: {a: .nan}\n", Refused("cannot be sent as JSON", "unsupported value: NaN")),
    "infinity": (b"spec: {a: -.inf}\n", Refused("cannot be sent as JSON", "unsupported value: -Inf")),
    "duplicate-key-last-wins": (b"spec: {dryRun: true, dryRun: false}\n", {"dryRun": False}),
    "latin-1-bytes-become-u+fffd": (
        b"# caf\xe9\nspec:\n  caf\xe9: 1\n  b: 'q\xe9\xe2\x82x'\n",
        {"caf\ufffd": 1, "b": "q\ufffd\ufffdx"},
    ),
    "byte-order-mark": (b"\xef\xbb\xbf" + HEAD.encode() + b"spec: {a: b}\n", {"a": "b"}),
    "utf-16-with-bom": ((("\ufeff" + HEAD + "spec: {a: b}\n").encode("utf-16-le")), {"a": "b"}),
    "control-character": (b"spec: {a: \x01}\n", Refused("not allowed", "control characters are not allowed")),
    "tab-indent": (b"spec:\n\ta: 1\n", Refused("not valid YAML", "cannot start any token")),
    "json": (
        b'{"apiVersion": "training.blackwell.dev/v1alpha1", "kind": "BlackwellTrainingJob",\n'
        b' "metadata": {"name": "job"}, "spec": {"a": 1.0, "b": [1, "x"], "c": 1e3}}\n',
        {"a": 1, "b": [1, "x"], "c": 1000},
    ),
}
# Documents: kubectl sends each non-empty one.
DOCUMENTS: dict[str, tuple[bytes, list[Any]]] = {
    "empty-documents-skipped": (
        b"---\n---\n" + (HEAD + "spec: {a: b}\n---\n").encode(),
        [{"a": "b"}],
    ),
    "two-documents": (
        (HEAD + "spec: {a: b}\n---\n" + HEAD + "spec: {c: d}\n").encode(),
        [{"a": "b"}, {"c": "d"}],
    ),
}


def _file_bytes(data: bytes) -> bytes:
    """The case's bytes, with an object head unless it has one (kubectl needs apiVersion and kind)."""
    if b"apiVersion" in data or data.startswith(b"\xff\xfe"):
        return data
    return HEAD.encode() + data


def find_kubectl() -> str | None:
    """The kubectl 1.35 scripts/bootstrap.sh fetches into .tools/ (pinned), else the one on PATH."""
    local = ROOT / ".tools" / "kubectl" / "kubectl"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("kubectl")


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def kubectl() -> str:
    binary = find_kubectl()
    if binary is None:
        _unavailable("kubectl not found in .tools/kubectl/ or on PATH (run scripts/bootstrap.sh --all)")
    assert binary is not None
    version = subprocess.run([binary, "version", "--client", "-o", "json"], capture_output=True, text=True)
    minor = json.loads(version.stdout)["clientVersion"]["minor"].rstrip("+")
    if minor != "35":  # the cases were recorded with 1.35; another minor may read YAML otherwise
        _unavailable(
            f"{binary} is kubectl 1.{minor}; the cases are kubectl 1.35's (scripts/bootstrap.sh --all)"
        )
    return binary


def _server_int(text: str) -> int | float:
    value = int(text)
    return value if -(2**63) <= value < 2**63 else float(value)


def kubectl_sends(kubectl: str, path: Path) -> tuple[list[Any] | None, str]:
    """The objects kubectl would send for the file (None when it refuses), and its error text."""
    empty = path.parent / "kubeconfig"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    result = subprocess.run(
        [kubectl, "label", "--local", "-f", str(path), "-o", "json", "zz-"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "KUBECONFIG": str(empty), "HOME": str(path.parent)},
        check=False,
    )
    if result.returncode != 0:
        return None, result.stderr
    # As the API server decodes JSON: an integer beyond int64 becomes a float64.
    decoder = json.JSONDecoder(parse_int=_server_int)
    objects, text = [], result.stdout.strip()
    while text:
        obj, end = decoder.raw_decode(text)
        if obj["metadata"].get("labels") == {}:  # what `label` adds, not what the file says
            del obj["metadata"]["labels"]
        objects.append(obj)
        text = text[end:].strip()
    return objects, result.stderr


def btj_reads(data: bytes) -> list[Any]:
    return load_documents(decode(data, "job.yaml"), "job.yaml")


def _specs(objects: list[Any]) -> list[Any]:
    return [obj.get("spec") for obj in objects]


@pytest.mark.parametrize("case", sorted(CASES))
def test_btj_reads_what_kubectl_1_35_sends(case: str) -> None:
    data, expected = CASES[case]
    if isinstance(expected, Refused):
        with pytest.raises(InputError) as info:
            btj_reads(_file_bytes(data))
        message = str(info.value)
        assert expected.btj in message and "\n" not in message and message.startswith("job.yaml: ")
    else:
        assert _specs(btj_reads(_file_bytes(data))) == [expected]


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_recorded_kubectl_behaviour_is_the_binarys(kubectl: str, tmp_path: Path, case: str) -> None:
    data, expected = CASES[case]
    path = tmp_path / "job.yaml"
    path.write_bytes(_file_bytes(data))
    sent, stderr = kubectl_sends(kubectl, path)
    if isinstance(expected, Refused):
        assert sent is None and expected.kubectl in stderr, stderr
    else:
        assert sent is not None, stderr
        assert _specs(sent) == [expected]
        assert sent == btj_reads(path.read_bytes())  # the whole object, head and metadata too


@pytest.mark.parametrize("case", sorted(DOCUMENTS))
def test_documents_are_read_as_kubectl_reads_them(kubectl: str, tmp_path: Path, case: str) -> None:
    data, expected = DOCUMENTS[case]
    assert _specs(btj_reads(data)) == expected
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    sent, stderr = kubectl_sends(kubectl, path)
    assert sent is not None, stderr
    assert sent == btj_reads(data)


def test_a_number_kubectl_sends_as_an_integer_plans(tmp_path: Path) -> None:
    """`nodes: 2.0` and `steps: 1e3` reach the API server as 2 and 1000: btj plans them, as it would 2."""
    _register_commands()
    path = tmp_path / "job.yaml"
    path.write_bytes(CASES["whole-floats-fill-integer-fields"][0])
    result = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["nodes"], plan["steps"]) == (2, 1000)


def test_what_kubectl_reads_silently_is_said(tmp_path: Path) -> None:
    """A key given twice and a Latin-1 byte are read as kubectl reads them, with a warning naming the line."""
    _register_commands()
    path = tmp_path / "job.yaml"
    path.write_bytes(
        (HEAD + BTJ_SPEC).encode() + b"  dryRun: true\n  dryRun: false\n  env: [{name: A, value: caf\xe9}]\n"
    )
    result = CliRunner().invoke(app, ["plan", str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    assert "line 7: key 'dryRun' is given again on line 8; the last one wins" in result.stderr
    assert "line 9: byte 0xE9 is not UTF-8" in result.stderr and "save the file as UTF-8" in result.stderr


def test_several_jobs_in_one_file_are_named(tmp_path: Path) -> None:
    """kubectl applies each; btj plans one job a run and says so, naming them (a ConfigMap beside is fine)."""
    _register_commands()
    other = "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
    path = tmp_path / "job.yaml"
    path.write_text(HEAD + BTJ_SPEC + other)
    assert CliRunner().invoke(app, ["plan", str(path), "-o", "json"]).exit_code == 0
    path.write_text(HEAD + BTJ_SPEC + "---\n" + HEAD.replace("name: job", "name: job-b") + BTJ_SPEC)
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert "2 BlackwellTrainingJob documents (job, job-b)" in result.stderr, result.stderr
    path.write_text(HEAD + BTJ_SPEC + "---\n- 1\n")
    result = CliRunner().invoke(app, ["render", str(path)])
    assert result.exit_code == 2 and "document 2 is a list, not a Kubernetes object" in result.stderr


def test_btj_render_writes_strings_kubectl_reads_back_as_strings(kubectl: str, tmp_path: Path) -> None:
    """`btj render | kubectl apply -f -`: a string go-yaml would read as another type is quoted."""
    _register_commands()
    words = ["y", "n", "1e3", "0o17", "08", "on", "~", "2026-01-01", "<<", "=", ".5_0"]
    env = ", ".join(f"{{name: V{i}, value: '{word}'}}" for i, word in enumerate(words))
    job = tmp_path / "job.yaml"
    job.write_text(HEAD + BTJ_SPEC + f"  env: [{env}]\n")
    rendered = CliRunner().invoke(app, ["render", str(job), "-o", "yaml"])
    assert rendered.exit_code == 0, rendered.output
    path = tmp_path / "rendered.yaml"
    path.write_text(rendered.stdout)
    sent, stderr = kubectl_sends(kubectl, path)
    assert sent is not None, stderr
    (job_object,) = [obj for obj in sent if obj["kind"] == "PyTorchJob"]
    container = job_object["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    values = {e["name"]: e.get("value") for e in container["env"] if e["name"].startswith("V")}
    assert values == {f"V{i}": word for i, word in enumerate(words)}
