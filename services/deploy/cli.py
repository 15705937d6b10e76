"""`headstart deploy ...`: render and validate the Helm chart here; status and smoke against a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

deploy_app = typer.Typer(no_args_is_help=True, help="Kubernetes: render/validate the Helm chart, check a release.")

VALUES_HELP = "values file (repeatable, applied in order, like helm -f)"
SET_HELP = "KEY=VALUE override (repeatable, helm --set syntax)"


def _fail(message: str, code: int = 2) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def _render(values: list[Path], sets: list[str], release: str, namespace: str):
    from services.deploy.chart import ChartError, render_chart

    try:
        return render_chart(values, sets, release=release, namespace=namespace)
    except ChartError as exc:
        _fail(str(exc))


@deploy_app.command("render")
def render(
    values: list[Path] = typer.Option([], "--values", "-f", help=VALUES_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    release: str = typer.Option("headstart", help="release name"),
    namespace: str = typer.Option("default", help="namespace"),
):
    """Print the chart's manifests (helm-python-sdk: Helm's Go SDK in-process, no helm binary).
    Exits 2 naming the key when the values break the chart's schema."""
    from services.deploy.chart import to_yaml

    typer.echo(to_yaml(_render(values, set_, release, namespace)), nl=False)


@deploy_app.command("validate")
def validate(
    values: list[Path] = typer.Option([], "--values", "-f", help=VALUES_HELP),
    set_: list[str] = typer.Option([], "--set", help=SET_HELP),
    release: str = typer.Option("headstart", help="release name"),
    namespace: str = typer.Option("default", help="namespace"),
    kube_version: Optional[str] = typer.Option(None, help="Kubernetes version to validate for (default: 1.33.0)"),
):
    """Render, lint (helm lint --strict) and validate every manifest (kubernetes-validate --strict;
    the vendored KubeRay/prometheus-operator CRD schemas; Ray Serve's config schema)."""
    from services.deploy.chart import compose_values, lint_chart
    from services.deploy.validate import KUBERNETES_VERSION, validate_objects

    version = kube_version or KUBERNETES_VERSION
    objects = _render(values, set_, release, namespace)
    findings = [str(f) for f in validate_objects(objects, version)]
    findings += lint_chart(compose_values(values, set_), kube_version=f"v{version}")
    for line in findings:
        typer.echo(line)
    if findings:
        _fail(f"{len(findings)} problem(s) in {len(objects)} objects", code=1)
    typer.echo(f"{len(objects)} objects valid for Kubernetes {version} (strict); helm lint clean")


def _api_client(context: Optional[str]):
    from kubernetes import config

    try:
        return config.new_client_from_config(context=context)
    except Exception:
        try:
            config.load_incluster_config()
        except Exception as exc:
            _fail(f"no kubeconfig (or in-cluster config) found: {exc}")
        from kubernetes import client

        return client.ApiClient()


@deploy_app.command("status")
def status(
    release: str = typer.Option("headstart", help="release name"),
    namespace: str = typer.Option("default", help="namespace"),
    context: Optional[str] = typer.Option(None, help="kubeconfig context"),
):
    """Each component's rollout and whether the engine's RayService is ready (exit 1 if not all)."""
    from services.deploy.cluster import release_status

    rows = release_status(_api_client(context), namespace, release)
    if not rows:
        _fail(f"no objects of release {release!r} in namespace {namespace!r}", code=1)
    width = max(len(r.ref) for r in rows)
    for r in rows:
        typer.echo(f"{'ready ' if r.ready else 'WAIT  '} {r.component:<20} {r.ref:<{width}}  {r.detail}")
    if not all(r.ready for r in rows):
        raise typer.Exit(1)


@deploy_app.command("smoke")
def smoke(
    release: str = typer.Option("headstart", help="release name"),
    namespace: str = typer.Option("default", help="namespace"),
    context: Optional[str] = typer.Option(None, help="kubeconfig context"),
    target: Optional[str] = typer.Option(None, help="gateway host:port (gRPC) to use instead of a port-forward"),
    token: Optional[str] = typer.Option(None, envvar="HEADSTART_TOKEN", help="tenant token"),
    db: str = typer.Option("concert_singer", help="database to ask"),
    question: str = typer.Option("How many singers are there?"),
    grpc_port: int = typer.Option(50051, help="the gateway's gRPC port (gateway.service.grpcPort)"),
    require_sql: bool = typer.Option(True, help="the answer must look like SQL (off for random weights)"),
):
    """Port-forward a ready gateway pod, type one question, check SQL and TTFT."""
    from services.deploy.smoke import SmokeError, run_smoke

    try:
        if target:
            result = run_smoke(target, token=token, db=db, question=question, require_sql=require_sql)
        else:
            from services.deploy.cluster import gateway_pod
            from services.deploy.smoke import port_forward

            api = _api_client(context)
            pod = gateway_pod(api, namespace, release)
            with port_forward(api, namespace, pod, grpc_port) as local:
                result = run_smoke(f"127.0.0.1:{local}", token=token, db=db, question=question,
                                   require_sql=require_sql)
    except (SmokeError, LookupError) as exc:
        _fail(str(exc), code=1)
    typer.echo(f"SQL: {result.sql}")
    typer.echo(f"TTFT {result.ttft_ms:.0f} ms, total {result.total_ms:.0f} ms, "
               f"{result.prompt_tokens} prompt tokens, {result.wall_ms:.0f} ms typing + answer")
