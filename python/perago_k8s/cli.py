"""`perago-k8s manifest` and `perago-k8s run` (also `python -m perago_k8s …`)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

from perago_k8s import __version__
from perago_k8s import body as task_body
from perago_k8s.manifest import ManifestError, generate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="perago-k8s", description=__doc__)
    parser.add_argument("--version", action="version", version=f"perago-k8s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    manifest = commands.add_parser(
        "manifest",
        help="write a PeragoTask for the @task of each module",
        description="Write a PeragoTask for the @task of each module (YAML, one document each). "
        "Nothing is written unless every module converts.",
    )
    manifest.add_argument("modules", nargs="+", metavar="MODULE", help="a Python import path, as for perago extract")
    manifest.add_argument("--image", required=True, help="the image holding the modules, perago and perago-k8s")
    manifest.add_argument("--namespace", help="metadata.namespace of every PeragoTask")
    manifest.add_argument("--name", help="metadata.name (one module only; default: from the task name)")
    manifest.add_argument("-o", "--output", type=Path, help="the file to write (default: standard output)")

    body = commands.add_parser(
        "run",
        help="run one attempt of a task function under perago-runner",
        description="Run one attempt of the task function under perago-runner (the PeragoTask's body command).",
    )
    body.add_argument("target", metavar="MODULE:FUNCTION")

    args = parser.parse_args(argv)
    if args.command == "run":
        return task_body.main(args.target)
    return _manifest(args)


def _manifest(args: argparse.Namespace) -> int:
    if args.name and len(args.modules) > 1:
        print("error: --name names one PeragoTask; give one module", file=sys.stderr)
        return 2
    sys.path.insert(0, os.getcwd())
    documents = []
    try:
        for module in args.modules:
            generated = generate(module, args.image, args.namespace)
            if args.name:
                generated.task["metadata"]["name"] = args.name
            for warning in generated.warnings:
                print(f"warning: {warning}", file=sys.stderr)
            documents.append(generated)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = "".join(
        f"---\n# perago-k8s manifest {d.module} (function {d.function})\n"
        + yaml.safe_dump(d.task, sort_keys=False, allow_unicode=True, width=100)
        for d in documents
    )
    if args.output is None:
        sys.stdout.write(text)
        return 0
    # Whole or not at all: a temporary file beside the output, renamed over it.
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=args.output.parent, delete=False) as out:
        out.write(text)
    os.replace(out.name, args.output)
    return 0
