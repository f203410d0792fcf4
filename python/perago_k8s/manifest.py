"""A PeragoTask for the `@task` of a Python Perago module.

Every field comes from the task's own declaration, as Python Perago validated it at import:
the schemas are what the Pydantic models emit (the operator renders the TaskDef from them the
way `perago extract` does), and every control is written out, defaults included, so that the
manifest says what the module said whatever either side's defaults become.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from perago import TaskDefinition, load_module_task

# A DNS-1123 label the operator can suffix for its children.
MAX_NAME_LENGTH = 52

GUARDRAIL_KINDS = {
    "require_file": "requireFile",
    "require_dir": "requireDir",
    "require_glob": "requireGlob",
    "forbid_glob": "forbidGlob",
}


class ManifestError(Exception):
    """What keeps a module from becoming a PeragoTask; nothing is written."""


@dataclass(frozen=True)
class Generated:
    module: str
    function: str
    task: dict[str, Any]
    warnings: list[str]


def generate(module: str, image: str, namespace: str | None = None) -> Generated:
    """The PeragoTask of `module`'s task, run by `python -m perago_k8s run MODULE:FUNCTION`."""
    try:
        definition = load_module_task(module)
    except ModuleNotFoundError as exc:
        raise ManifestError(f"{module}: cannot import it: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the module's own import errors, named
        raise ManifestError(f"{module}: {type(exc).__name__}: {exc}") from exc
    function = _function_name(module, definition)
    where = f"{module}: task {definition.name!r}"
    metadata: dict[str, Any] = {"name": object_name(definition.name, where)}
    if namespace:
        metadata["namespace"] = namespace
    spec: dict[str, Any] = {
        "taskName": definition.name,
        "ownerEmail": definition.owner_email,
    }
    if definition.description is not None:
        spec["description"] = definition.description
    if definition.workspace is not None:
        spec["workspace"] = _workspace(definition)
    spec["paramsSchema"] = _schema(definition.params_model, where, "params")
    spec["resultSchema"] = _schema(definition.output_model, where, "result")
    # Written even when false: a PeragoTask's default is strict, Python Perago's is not.
    spec["strictParams"] = definition.strict_params
    warnings = []
    if definition.metrics is not None:
        spec["metrics"] = {
            "attempts": definition.metrics.attempts,
            "workspaceIo": definition.metrics.workspace_io,
            "workerCapacity": definition.metrics.worker_capacity,
        }
        warnings.append(
            f"{where} records application metrics: declare each under spec.metrics.application "
            "(name, kind, labels), or the sidecar drops its samples"
        )
    spec["controls"] = _controls(definition)
    spec["executor"] = {
        "body": {
            "image": image,
            "command": ["python", "-m", "perago_k8s", "run", f"{module}:{function}"],
        }
    }
    task = {
        "apiVersion": "perago.io/v1alpha1",
        "kind": "PeragoTask",
        "metadata": metadata,
        "spec": spec,
    }
    return Generated(module=module, function=function, task=task, warnings=warnings)


def object_name(task_name: str, where: str) -> str:
    """The task name as a DNS-1123 label: lower case, runs of other characters as one '-'."""
    name = re.sub(r"[^a-z0-9]+", "-", task_name.lower()).strip("-")
    name = name[:MAX_NAME_LENGTH].rstrip("-")
    if not name:
        raise ManifestError(f"{where}: the task name gives no Kubernetes object name; pass --name")
    return name


def _function_name(module: str, definition: TaskDefinition) -> str:
    """The module-level name the body imports; a function defined elsewhere cannot be run."""
    function = definition.fn.__name__
    loaded = importlib.import_module(module)
    if getattr(loaded, function, None) is not definition.fn:
        raise ManifestError(
            f"{module}: task {definition.name!r}: its function {definition.fn.__qualname__} is "
            f"not the module-level name {module}.{function}, which the body imports"
        )
    return function


def _schema(model: Any, where: str, what: str) -> dict[str, Any]:
    try:
        return model.model_json_schema()
    except Exception as exc:  # noqa: BLE001 - Pydantic's reason, named
        raise ManifestError(
            f"{where}: the {what} model {model.__name__} has no JSON schema: {exc}"
        ) from exc


def _workspace(definition: TaskDefinition) -> dict[str, Any]:
    workspace = definition.workspace
    assert workspace is not None
    out: dict[str, Any] = {"prefix": workspace.prefix}
    if workspace.read_only:
        out["readOnly"] = True
    for phase in ("pre", "post"):
        guardrails = getattr(workspace, phase)
        if guardrails:
            out[phase] = [_guardrail(g) for g in guardrails]
    return out


def _guardrail(guardrail: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": GUARDRAIL_KINDS[guardrail.kind], "path": guardrail.path}
    if guardrail.min_count is not None:
        out["minCount"] = guardrail.min_count
    if guardrail.max_count is not None:
        out["maxCount"] = guardrail.max_count
    return out


def _controls(definition: TaskDefinition) -> dict[str, Any]:
    controls = definition.controls
    retry, timeout, limits = controls.retry, controls.timeout, controls.limits
    out: dict[str, Any] = {
        "retry": {
            "count": retry.count,
            "logic": retry.logic,
            "delaySeconds": retry.delay_seconds,
            "maxDelaySeconds": retry.max_delay_seconds,
            "jitterMs": retry.jitter_ms,
        },
        "timeout": {
            "policy": timeout.policy,
            "seconds": timeout.seconds,
            "responseSeconds": timeout.response_seconds,
            "pollSeconds": timeout.poll_seconds,
            "totalSeconds": timeout.total_seconds,
        },
    }
    limit_fields = {
        "concurrentExecLimit": limits.concurrent_exec_limit,
        "rateLimitFrequencyInSeconds": limits.rate_limit_frequency_in_seconds,
        "rateLimitPerFrequency": limits.rate_limit_per_frequency,
    }
    limit_fields = {k: v for k, v in limit_fields.items() if v is not None}
    if limit_fields:
        out["limits"] = limit_fields
    budget = controls.publish_budget
    if budget is not None:
        out["publishBudget"] = {
            "observedMergeP99Seconds": budget.observed_merge_p99_seconds,
            "safetyMarginSeconds": budget.safety_margin_seconds,
            "lakefsMergeTimeoutSeconds": budget.lakefs_merge_timeout_seconds,
            "conductorCompletionTimeoutSeconds": budget.conductor_completion_timeout_seconds,
            "workerShutdownGraceSeconds": budget.worker_shutdown_grace_seconds,
            "heartbeatIntervalSeconds": budget.heartbeat_interval_seconds,
        }
    return out
