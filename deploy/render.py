"""Renders and lints the Highwater Helm chart offline, with helm-python-sdk (no helm binary).

    python deploy/render.py template [-f VALUES]... [--name N] [--namespace NS] [-o FILE]
    python deploy/render.py lint [-f VALUES]...
    python deploy/render.py base [--check]

``template`` prints the manifests ``helm template`` would (hooks and tests included,
NOTES.txt left out); ``lint`` fails on any lint error or warning; ``base`` writes the
Kustomize bases from the chart: ``deploy/kustomize/base/highwater.yaml`` with
``deploy/kustomize/base/values.yaml``, and ``deploy/kustomize/secure-base/highwater.yaml``
(the prod overlay's: TLS and auth on) with those values and
``deploy/kustomize/secure-base/values.yaml`` over them; or with ``--check`` fails if a
file differs from a fresh render. Values that break ``values.schema.json`` fail with the key named.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

DEPLOY = Path(__file__).resolve().parent
CHART = DEPLOY / "helm" / "highwater"
BASE = DEPLOY / "kustomize" / "base"
BASE_VALUES = BASE / "values.yaml"
BASE_MANIFESTS = BASE / "highwater.yaml"
BASE_RELEASE = "highwater"
BASE_NAMESPACE = "highwater"
SECURE_BASE = DEPLOY / "kustomize" / "secure-base"
BASES: Mapping[Path, Sequence[Path]] = {
    BASE: (BASE_VALUES,),
    SECURE_BASE: (BASE_VALUES, SECURE_BASE / "values.yaml"),
}
"""Each Kustomize base and the values files it is rendered from, merged in order."""


class RenderError(Exception):
    """The chart did not render or lint: the values broke its schema or a template failed."""


def load_values(paths: Sequence[Path]) -> dict[str, Any]:
    """The values files merged left to right, as ``helm -f a -f b`` merges them."""
    merged: dict[str, Any] = {}
    for path in paths:
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise RenderError(f"{path}: a values file holds a mapping")
        merged = merge_values(merged, loaded)
    return merged


def merge_values(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``: mappings merged key by key, anything else replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_values(merged[key], value)
        else:
            merged[key] = value
    return merged


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "highwater",
    namespace: str = "highwater",
    tests: bool = True,
) -> dict[str, str]:
    """Template path -> rendered manifests (NOTES.txt left out; ``tests`` keeps the
    ``helm test`` hooks)."""
    chart = helm.Chart.load(CHART)
    try:
        rendered = chart.render(
            dict(values or {}), name=name, namespace=namespace, is_install=True, revision=1
        )
    except helm.HelmError as e:
        raise RenderError(str(e)) from None
    return {
        path: text
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt")
        and text.strip()
        and (tests or "/templates/tests/" not in path)
    }


def documents(rendered: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every manifest of a render, parsed, in template order."""
    return [
        document for text in rendered.values() for document in yaml.safe_load_all(text) if document
    ]


def as_stream(rendered: Mapping[str, str]) -> str:
    """One YAML stream with a ``# Source:`` line before each template, as helm prints."""
    parts = []
    for path, text in rendered.items():
        for document in text.split("\n---\n"):
            if document.strip() and document.strip() != "---":
                parts.append(f"---\n# Source: {path}\n{document.strip()}\n")
    return "".join(parts)


def lint(values: Mapping[str, Any] | None = None) -> list[str]:
    """Lint findings of severity warning or error (empty: the chart is clean)."""
    report = helm.lint(CHART, dict(values or {}), strict=True)
    findings = [
        f"{message['path']}: {message['error']}"
        for message in report["messages"]
        if message["severity"] >= 2
    ]
    return findings + list(report.get("errors") or [])


def render_base(base: Path = BASE) -> str:
    """A Kustomize base's manifests, from the chart and the base's values files."""
    values = BASES[base]
    rendered = render(load_values(values), name=BASE_RELEASE, namespace=BASE_NAMESPACE, tests=False)
    names = " and ".join(str(path.relative_to(DEPLOY.parent)) for path in values)
    header = (
        f"# Rendered from deploy/helm/highwater with {names} by\n"
        "# `make kustomize-base`; edit the chart or those values, not this file.\n"
    )
    return header + as_stream(rendered)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    template = commands.add_parser("template", help="print the rendered manifests")
    linter = commands.add_parser("lint", help="lint the chart (warnings count)")
    for sub in (template, linter):
        sub.add_argument("-f", "--values", type=Path, action="append", default=[])
    template.add_argument("--name", default="highwater")
    template.add_argument("--namespace", default="highwater")
    template.add_argument("-o", "--output", type=Path, default=None)
    base = commands.add_parser("base", help="write (or --check) the Kustomize base")
    base.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.command == "template":
            stream = as_stream(
                render(load_values(args.values), name=args.name, namespace=args.namespace)
            )
            if args.output is None:
                sys.stdout.write(stream)
            else:
                args.output.parent.mkdir(parents=True, exist_ok=True)
                args.output.write_text(stream)
        elif args.command == "lint":
            findings = lint(load_values(args.values))
            for finding in findings:
                print(finding, file=sys.stderr)
            if findings:
                return 1
            print(f"{CHART.name}: linted clean")
        else:
            for base in BASES:
                fresh, manifests = render_base(base), base / BASE_MANIFESTS.name
                if not args.check:
                    manifests.write_text(fresh)
                elif manifests.read_text() != fresh:
                    print(f"{manifests} is stale: run `make kustomize-base`", file=sys.stderr)
                    return 1
    except RenderError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
